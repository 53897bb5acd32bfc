"""``grpokit report``: one self-contained HTML page about a run, plus its plots as PNG files.

The page needs no network and no scripts: plots are PNGs embedded as data URIs, styles inline.
Sections, each meant to fit one screen: run (config, versions, key numbers), rewards, training
dynamics, completions, time per phase, pass rate against the preflight forecast, held-out checks,
monitor alerts, sample completions early vs late, and the eval table when one is given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pydantic
from matplotlib.figure import Figure

from grpokit.core.forecast import forecast_checks
from grpokit.errors import UserError
from grpokit.evaluate import plots
from grpokit.evaluate.html import esc, img, page, section, table
from grpokit.evaluate.review_agreement import agreement, agreement_html
from grpokit.evaluate.review_data import DB_NAME, LabelStore, find_samples
from grpokit.evaluate.rundir import RunData, load_run
from grpokit.evaluate.schema import EvalResult
from grpokit.evaluate.tables import eval_tables, to_html, transcripts_html
from grpokit.evaluate.transcripts import is_transcript
from grpokit.evaluate.transcripts import to_html as transcript_html
from grpokit.files import write_atomic
from grpokit.monitor.series import ema, mean
from grpokit.rewards.text import completion_text, user_request

MAX_SAMPLES = 4
"""Completions shown per side (early, late)."""
MAX_CHARS = 1500
"""Longer completions are cut in the page (the full text is in completions.jsonl)."""


def load_eval(eval_dir: Path) -> EvalResult:
    path = Path(eval_dir) / "eval.json"
    if not path.is_file():
        raise UserError(
            f"--eval {eval_dir}: no eval.json there; run `grpokit eval ... --out {eval_dir}`"
        )
    try:
        return EvalResult.model_validate_json(path.read_text(encoding="utf-8"))
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise UserError(
            f"{path}: not a grpokit eval file ({where}: {first['msg']}); re-run `grpokit eval`"
        ) from None


# ---- samples ------------------------------------------------------------------------------------


def _step_of(row: dict[str, Any]) -> int | None:
    step = row.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def pick_samples(
    completions: Sequence[dict[str, Any]],
) -> tuple[tuple[int, str, list[dict[str, Any]]], tuple[int, str, list[dict[str, Any]]]] | None:
    """Early and late samples to set side by side: (step, prompt, rows) for each.

    Prefers one prompt seen both in the first and the last quarter of the logged steps, so the
    two columns answer the same question; otherwise the first prompt of the first and last step.
    """
    rows = [r for r in completions if _step_of(r) is not None and "completion" in r]
    if not rows:
        return None
    steps = sorted({_step_of(r) or 0 for r in rows})
    if len(steps) < 2:
        return None
    quarter = max(1, len(steps) // 4)
    early_steps, late_steps = set(steps[:quarter]), set(steps[-quarter:])
    by_prompt: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in rows:
        text = user_request(r.get("prompt"))
        by_prompt.setdefault(text, {}).setdefault(_step_of(r) or 0, []).append(r)
    for text, per_step in by_prompt.items():
        early = sorted(s for s in per_step if s in early_steps)
        late = sorted(s for s in per_step if s in late_steps)
        if early and late and early[0] != late[-1]:
            return (early[0], text, per_step[early[0]]), (late[-1], text, per_step[late[-1]])

    def first_group(step: int) -> tuple[int, str, list[dict[str, Any]]]:
        at = [r for r in rows if _step_of(r) == step]
        text = user_request(at[0].get("prompt"))
        return step, text, [r for r in at if user_request(r.get("prompt")) == text]

    return first_group(steps[0]), first_group(steps[-1])


def _sample_card(row: dict[str, Any]) -> str:
    text = completion_text(row.get("completion"))
    cut = ""
    if len(text) > MAX_CHARS:
        cut = f'<div class="meta">… {len(text) - MAX_CHARS} more characters in completions.jsonl</div>'
        text = text[:MAX_CHARS]
    body = f"<pre>{esc(text)}</pre>{cut}"
    if is_transcript(row.get("transcript")):  # with tools: the turns, calls and results marked
        body = transcript_html(row["transcript"], max_chars=MAX_CHARS)
    meta = []
    reward = row.get("reward")
    if isinstance(reward, int | float):
        meta.append(f"<b>reward {reward:.3g}</b>")
    for name, value in (row.get("rewards") or {}).items():
        shown = (
            "None"
            if value is None
            else (f"{value:.3g}" if isinstance(value, int | float) else value)
        )
        meta.append(f"{esc(name)} {esc(shown)}")
    adv = row.get("advantage")
    if isinstance(adv, int | float):
        meta.append(f"advantage {adv:+.2f}")
    return f'<div class="sample"><div class="meta">{" · ".join(meta)}</div>{body}</div>'


def samples_html(completions: Sequence[dict[str, Any]]) -> str:
    picked = pick_samples(completions)
    if picked is None:
        return '<p class="muted">completions.jsonl has no samples from two different steps.</p>'
    cols = []
    for label, (step, prompt, rows) in zip(("Early", "Late"), picked, strict=True):
        ordered = sorted(
            rows,
            key=lambda r: -(r["reward"] if isinstance(r.get("reward"), int | float) else -1e9),
        )
        cards = "".join(_sample_card(r) for r in ordered[:MAX_SAMPLES])
        more = len(rows) - min(len(rows), MAX_SAMPLES)
        extra = f'<p class="muted">{more} more in completions.jsonl</p>' if more else ""
        cols.append(
            f"<div><h3>{label}: step {step}</h3>"
            f'<div class="meta"><b>prompt</b></div><pre>{esc(prompt[:600])}</pre>'
            f"{cards}{extra}</div>"
        )
    return f'<div class="cols">{"".join(cols)}</div>'


# ---- other sections -----------------------------------------------------------------------------


def _first_last(run: RunData, key: str) -> tuple[float | None, float | None]:
    """The smoothed value at the first and last step that have the metric."""
    values = [v for v in run.series(key)[1] if v is not None]
    if not values:
        return None, None
    smooth = [v for v in ema(values, plots.smoothing_for(len(values))) if v is not None]
    return smooth[0], smooth[-1]


def summary_rows(run: RunData, alerts: Sequence[dict[str, Any]]) -> list[list[object]]:
    steps = run.steps
    rows: list[list[object]] = [["steps logged", f"{len(steps)} ({steps[0]} - {steps[-1]})"]]
    for key in ["reward", *[f"rewards/{n}/mean" for n in run.reward_names()], "kl", "entropy",
                "frac_reward_zero_std", "completions/mean_length", "mismatch/kl"]:  # fmt: skip
        first, last = _first_last(run, key)
        if first is not None and last is not None:
            rows.append([key, f"{first:.3g} → {last:.3g} (smoothed)"])
    total = [v for v in run.series("step_time")[1] if v is not None]
    if total:
        rows.append(["training time", f"{sum(total) / 60:.1f} min ({mean(total):.1f} s a step)"])
    rows += judge_usage_rows(run)
    rows.append(["monitor alerts", str(len(alerts))])
    return rows


def judge_usage_rows(run: RunData) -> list[list[object]]:
    """What the judges used over the run: tokens in / out and, when priced, the cost.

    A judge reward logs its step's totals as ``judge/tokens_in`` (``judge/<reward>/tokens_in``
    when several rewards report metrics) beside per-judge ``judge/<label>/...`` parts: the
    totals are the keys with the fewest parts.
    """
    rows: list[list[object]] = []
    logged = run.keys()
    for kind, label in (("tokens_in", "judge tokens in"), ("tokens_out", "judge tokens out"),
                        ("cost", "judge cost")):  # fmt: skip
        keys = [k for k in logged if k.startswith("judge/") and k.endswith(f"/{kind}")]
        if not keys:
            continue
        fewest = min(k.count("/") for k in keys)
        total = sum(
            v for k in keys if k.count("/") == fewest for v in run.series(k)[1] if v is not None
        )
        rows.append([label, f"{total:.4g}" if kind == "cost" else f"{total:,.0f}"])
    return rows


def timing_rows(run: RunData) -> list[list[object]]:
    totals = [
        (label, sum(v for v in run.series(key)[1] if v is not None))
        for key, label in plots.PHASES
        if run.has(key)
    ]
    whole = sum(t for _, t in totals)
    return [[label, round(t, 1), f"{t / whole:.0%}" if whole else "–"] for label, t in totals]


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        out: list[tuple[str, str]] = []
        for k, v in value.items():
            out.extend(_flatten(v, f"{prefix}/{k}" if prefix else str(k)))
        return out
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return [(prefix, text if len(text) <= 200 else text[:199] + "…")]


def forecast_rows(run: RunData, names: Sequence[str]) -> list[list[object]]:
    """Per reward, then per reward part with a forecast (a checklist's items): the forecast,
    the training pass rate at the first step and over the last 20%, the last held-out one."""
    rows: list[list[object]] = []
    parts = [c.name for c in forecast_checks(run.metrics) if c.name not in names]
    for n in [*names, *parts]:
        forecast = [v for v in run.series(f"forecast/{n}/pass_rate")[1] if v is not None]
        key = f"pass_rate/{n}" if n in names else f"{n}/pass_rate"
        observed = [v for v in run.series(key)[1] if v is not None]
        held = [v for v in run.series(f"eval/{n}/pass_rate")[1] if v is not None]
        if not (forecast or observed or held):
            continue
        tail = observed[-max(1, len(observed) // 5) :] if observed else []
        rows.append(
            [
                n,
                f"{forecast[-1]:.0%}" if forecast else "–",
                f"{observed[0]:.0%}" if observed else "–",
                f"{mean(tail):.0%}" if tail else "–",
                f"{held[-1]:.0%}" if held else "–",
            ]
        )
    return rows


def review_section(run_dir: Path) -> str | None:
    """The agreement of the person's labels (``grpokit review``) with the rewards; None when the
    run has no label database."""
    if not (run_dir / DB_NAME).is_file():
        return None
    try:
        found = find_samples(run_dir)
        store = LabelStore.open(found, [], create=False)
    except UserError as e:
        return f'<div class="warn">{esc(e)}</div>'
    return agreement_html(agreement(found.samples, store), len(store.labels()), store.reviewers())


def alerts_html(
    alerts: Sequence[dict[str, Any]], eval_alerts: Sequence[dict[str, Any]] = ()
) -> str:
    """The training monitors' alerts, and with ``--eval`` the warnings the same monitors gave on
    the eval's samples (each model against the base: repetition, one text filling a group ...),
    which a reader looking for what went wrong expects here, not only in eval.md."""
    parts: list[str] = []
    if alerts:
        rows = [[a.get("step"), a.get("rule"), a.get("value"), a.get("message", "")]
                for a in alerts]  # fmt: skip
        parts.append(
            f'<div class="alert">{len(alerts)} monitor alert(s); red dotted lines mark them on '
            f"the plots.</div>" + table(["step", "rule", "value", "message"], rows)
        )
    elif eval_alerts:
        parts.append('<p class="muted">No monitor fired during training.</p>')
    if eval_alerts:
        rows = [[a.get("model"), a.get("rule"), a.get("value"), a.get("message", "")]
                for a in eval_alerts]  # fmt: skip
        parts.append(
            f'<div class="alert">{len(eval_alerts)} warning(s) on the eval samples, each model '
            f"against the base.</div>" + table(["model", "rule", "value", "message"], rows)
        )
    return "".join(parts) or '<p class="muted">No monitor fired.</p>'


@dataclass(frozen=True)
class _Report:
    """What every section of one report reads: the run, its monitor alerts and reward names, and
    where the plots go."""

    run: RunData
    alerts: list[dict[str, Any]]
    names: list[str]
    report_dir: Path

    def figure(self, name: str, fig: Figure | None, alt: str) -> str:
        """A plot for the page (empty without one), its PNG written to the report directory."""
        if fig is None:
            return ""
        data = plots.png_bytes(fig)
        write_atomic(self.report_dir / f"{name}.png", data)
        return img(data, alt)


def build_report(run_dir: Path, *, eval_dir: Path | None = None, out: Path | None = None) -> Path:
    """Write the HTML report of a run and its plots as PNG files; returns the HTML path.

    Args:
        run_dir: the run directory (metrics.jsonl required; the rest optional).
        eval_dir: a directory with the eval.json of ``grpokit eval``, shown as the eval section.
        out: the HTML file; default ``<run_dir>/report/report.html``. PNGs always go to
            ``<run_dir>/report/``.
    """
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    # Read first: a bad --eval fails before any PNG is written.
    evaluation = load_eval(eval_dir) if eval_dir is not None else None
    report_dir = run_dir / "report"
    out = Path(out) if out is not None else report_dir / "report.html"
    report = _Report(run, run.alerts(), run.reward_names(), report_dir)
    parts = [
        *_heading(run, run_dir),
        _run_section(report),
        *_training_sections(report),
        *_outcome_sections(report, run_dir, evaluation),
    ]
    write_atomic(out, page(f"grpokit report: {run.name}", "".join(parts)).encode("utf-8"))
    return out


def _heading(run: RunData, run_dir: Path) -> list[str]:
    """The title, where the run is and when the page was made, then what could not be read: the
    warnings come first so that a reader knows, before any number, that the page shows a part."""
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"<h1>grpokit run report: {esc(run.name)}</h1>",
        f'<p class="muted">{esc(run_dir.resolve())} · generated {generated}</p>',
    ]
    if run.skipped:
        listed = "".join(f"<li>{esc(s)}</li>" for s in run.skipped[:10])
        more = f"<li>… and {len(run.skipped) - 10} more</li>" if len(run.skipped) > 10 else ""
        parts.append(
            f'<div class="warn"><b>Skipped {len(run.skipped)} unreadable line(s)</b>; the report '
            f"shows the rest.<ul>{listed}{more}</ul></div>"
        )
    parts += [f'<div class="warn">{esc(note)}</div>' for note in run.notes]
    return parts


def _run_section(report: _Report) -> str:
    """The run at a glance: the key numbers beside the package versions, then the config, each
    with a note in its place when the run directory lacks the file."""
    run = report.run
    versions = (
        table(["package", "version"], sorted(run.versions.items()))
        if run.versions
        else ('<p class="muted">no versions.json</p>')
    )
    config = (
        f'<pre class="config">{esc(run.config_text)}</pre>'
        if run.config_text is not None
        else '<p class="muted">no config.yaml</p>'
    )
    summary = table(["metric", "value"], summary_rows(run, report.alerts))
    return section(
        "run",
        "Run: summary, versions, config",
        f'<div class="cols"><div>{summary}</div><div>{versions}</div></div>{config}',
    )


def _training_sections(report: _Report) -> list[str]:
    """The curves over the training steps: rewards, dynamics and completions always; time per
    phase, pass rates and held-out checks only when the run logged what they plot."""
    run, alerts = report.run, report.alerts
    parts = [
        section(
            "rewards",
            "Rewards",
            report.figure("rewards", plots.fig_rewards(run, alerts), "rewards")
            + '<p class="muted">Faint: per step; bold: exponential moving average.</p>',
        ),
        section(
            "dynamics",
            "KL, entropy, equal-reward groups, clipping",
            report.figure("dynamics", plots.fig_dynamics(run, alerts), "dynamics")
            + '<p class="muted">A share of equal-reward groups near 1 means no learning signal '
            "(all completions of a prompt scored alike).</p>",
        ),
        section(
            "completions",
            "Completions: length, truncation, repetition",
            report.figure("completions", plots.fig_lengths(run, alerts), "lengths"),
        ),
    ]
    optional = (_timing_section(report), _forecast_section(report), _heldout_section(report))
    return parts + [part for part in optional if part is not None]


def _timing_section(report: _Report) -> str | None:
    """Seconds per phase, plotted and totalled; None when the run logs no phase times."""
    timing = plots.fig_timing(report.run)
    if timing is None:
        return None
    return section(
        "timing",
        "Time per phase",
        report.figure("timing", timing, "time per phase")
        + table(["phase", "seconds", "share"], timing_rows(report.run)),
    )


def _forecast_section(report: _Report) -> str | None:
    """Observed pass rates against the preflight forecast, and preflight.json itself; None when
    the run has neither pass rates to plot nor a preflight."""
    forecast = plots.fig_pass_rates(report.run, report.names)
    pre = report.run.preflight
    if forecast is None and pre is None:
        return None
    content = report.figure("pass_rates", forecast, "pass rates vs forecast")
    rows = forecast_rows(report.run, report.names)
    if rows:
        header = ["reward", "forecast", "observed, first step", "observed, last 20%",
                  "held-out, last"]  # fmt: skip
        content += table(header, rows)
    if pre is not None:
        content += "<h3>preflight.json</h3>" + table(["key", "value"], _flatten(pre)[:40])
    return section("forecast", "Pass rate against the preflight forecast", content)


def _heldout_section(report: _Report) -> str | None:
    """The held-out checks run during training; None when there were none."""
    heldout = plots.fig_heldout(report.run, report.names, report.alerts)
    if heldout is None:
        return None
    return section(
        "heldout",
        "Held-out checks during training",
        report.figure("heldout", heldout, "held-out"),
    )


def _outcome_sections(report: _Report, run_dir: Path, evaluation: EvalResult | None) -> list[str]:
    """What came of the run: the alerts (with the eval's warnings), samples early vs late, the
    person's review when there is one and the eval tables when ``--eval`` gave them."""
    eval_alerts = evaluation.alerts if evaluation is not None else []
    parts = [
        section("alerts", "Monitor alerts", alerts_html(report.alerts, eval_alerts)),
        section("samples", "Samples: early vs late", samples_html(report.run.completions)),
    ]
    review = review_section(run_dir)
    if review is not None:
        parts.append(section("review", "Human review against the rewards", review))
    if evaluation is not None:
        parts.append(
            section(
                "eval",
                f"Eval on held-out prompts ({evaluation.heldout})",
                to_html(eval_tables(evaluation)) + transcripts_html(evaluation),
            )
        )
    return parts
