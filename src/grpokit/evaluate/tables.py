"""The eval tables, built once and rendered as Markdown (terminal) or HTML (report)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grpokit.evaluate import transcripts
from grpokit.evaluate.html import esc, table
from grpokit.evaluate.schema import EvalResult, PairedComparison, RewardSummary, TranscriptSample

INTERVAL_NOTES = {
    "wilson": "95% intervals: Wilson over all samples as if independent (too narrow when the "
    "samples of a prompt are correlated)",
    "prompt-cluster": "95% intervals: per-prompt cluster (Wilson on the effective sample size "
    "n / design effect, t quantile on prompts - 1 df), since samples of one prompt are correlated",
}
"""The footnote of the per-model table, by EvalResult.intervals."""


@dataclass(frozen=True)
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


def pct(rate: float | None, ci: tuple[float, float] | None = None) -> str:
    """A rate as a percentage, with its interval when given: '41% [27, 56]'."""
    if rate is None:
        return "–"
    if ci is None:
        return f"{rate:.0%}"
    return f"{rate:.0%} [{ci[0] * 100:.0f}, {ci[1] * 100:.0f}]"


def num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def shorten(text: str, limit: int = 60) -> str:
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def _reward_cell(r: RewardSummary) -> str:
    if r.pass_rate is None:
        return f"{num(r.mean)}"
    return f"{num(r.mean)} · pass {pct(r.pass_rate, r.pass_ci)}"


def eval_tables(result: EvalResult) -> list[Table]:
    """Per-prompt table, per-model summary, pass@k and the paired comparison."""
    tables = [_per_prompt_table(result), _summary_table(result)]
    # The later tables appear only where the eval has something to put in them.
    optional = (_pass_at_k_table(result), _checklist_table(result), _paired_table(result))
    tables += [t for t in optional if t is not None]
    return tables


def _per_prompt_table(result: EvalResult) -> Table:
    """How many of each prompt's samples every model got compliant, so that a reader sees which
    prompts a model gains or loses on, not only its overall rate."""
    labels = [m.label for m in result.models]
    return Table(
        title="Per prompt: compliant samples per model",
        header=["#", "prompt", "samples", *labels],
        rows=[
            [str(p.index), shorten(p.prompt), str(p.samples)]
            + [
                f"{p.compliant[label]}/{p.samples}" if label in p.compliant else "–"
                for label in labels
            ]
            for p in result.prompts
        ],
        note=_compliant_note(result.thresholds),
    )


def _compliant_note(thresholds: dict[str, float]) -> str:
    """The per-prompt table's footnote: what 'compliant' means for this eval (the thresholds it
    applied), or how to set one where no reward has any."""
    return (
        "compliant: every reward with a pass threshold reached it ("
        + (
            ", ".join(f"{n} >= {t:g}" for n, t in thresholds.items())
            or "no reward has a threshold; set one with --pass NAME=VALUE"
        )
        + ")"
    )


def _summary_table(result: EvalResult) -> Table:
    """One row a model: compliant rate, each reward's mean and pass rate, length and truncation;
    the footnote says how many samples stand behind it and how the intervals were computed."""
    return Table(
        title="Per model: reward means and pass rates (95% intervals)",
        header=["model", "compliant", *result.rewards, "mean length", "truncated"],
        rows=[
            [m.label, pct(m.compliant_rate, m.compliant_ci)]
            + [_reward_cell(m.rewards[r]) if r in m.rewards else "–" for r in result.rewards]
            + [f"{m.mean_length:.1f}", pct(m.truncated_frac)]
            for m in result.models
        ],
        note=f"{result.samples_per_prompt} samples per prompt, {len(result.prompts)} prompts, "
        f"seed {result.seed}; " + INTERVAL_NOTES[result.intervals],
    )


def _pass_at_k_table(result: EvalResult) -> Table | None:
    """pass@k of each model and binary reward (one with pass@k values) for every k any reward
    reported; None when no reward has pass@k."""
    ks = sorted({kk for m in result.models for r in m.rewards.values() for kk in r.pass_at_k})
    binary = [
        r
        for r in result.rewards
        if any(m.rewards.get(r) and m.rewards[r].pass_at_k for m in result.models)
    ]
    if not (ks and binary):
        return None
    rows = []
    for m in result.models:
        for r in binary:
            s = m.rewards.get(r)
            rows.append(
                [m.label, r] + [pct(s.pass_at_k.get(kk)) if s is not None else "–" for kk in ks]
            )
    return Table("pass@k", ["model", "reward", *[f"pass@{kk}" for kk in ks]], rows)


def _checklist_table(result: EvalResult) -> Table | None:
    """Each checklist item's pass rate per model, items in the order the models first report
    them; None when no model has a checklist."""
    items = list(dict.fromkeys(key for m in result.models for key in m.checklist))
    if not items:
        return None
    return Table(
        title="Checklist items: pass rate per model (95% intervals)",
        header=["item", *[m.label for m in result.models]],
        rows=[
            [item]
            + [
                pct(m.checklist[item].pass_rate, m.checklist[item].ci)
                if item in m.checklist
                else "–"
                for m in result.models
            ]
            for item in items
        ],
        note="pass rate: the mean of the item's 0/1 successes or probabilities of "
        "success; per-prompt (cluster) intervals; the paired comparison below has "
        "each model's difference from the first",
    )


def _paired_table(result: EvalResult) -> Table | None:
    """Each later model's per-prompt difference from the first, with its interval and the
    difference at equal length; None when the eval has none (as with a single model)."""
    if not result.paired:
        return None
    return Table(
        title="Paired comparison against the first model (per-prompt means)",
        header=[
            "metric",
            "model",
            "difference",
            "95% interval",
            "at equal length",
            "prompts",
        ],
        rows=[_paired_row(c) for c in result.paired],
        note="95% t intervals over per-prompt means (prompts are the independent units); "
        "an interval that excludes 0 is a difference the prompts support. At equal "
        "length: the difference among answers of the same length (least squares on the "
        "model and the length, prompts resampled): a gain that is only longer answers "
        "vanishes there. 'Where X passes': over the samples that pass X's threshold "
        "only; a prompt where either model has none drops out",
    )


def _paired_row(c: PairedComparison) -> list[str]:
    """One comparison as a row: the metric (restricted to the samples that pass ``among`` where
    set), which models, the difference, its interval, at equal length and how many prompts."""
    return [
        c.metric if c.among is None else f"{c.metric}, where {c.among} passes",
        f"{c.other} - {c.base}",
        f"{c.diff:+.3g}",
        f"[{c.ci[0]:+.3g}, {c.ci[1]:+.3g}]" if c.ci else "–",
        _at_equal_length_cell(c.at_equal_length),
        str(c.n_prompts),
    ]


def _at_equal_length_cell(value: tuple[float, float, float] | None) -> str:
    if value is None:
        return "–"
    d, lo, hi = value
    return f"{d:+.3g} [{lo:+.3g}, {hi:+.3g}]"


def to_markdown(tables: Sequence[Table]) -> str:
    out: list[str] = []
    for t in tables:
        out.append(f"### {t.title}\n")
        out.append("| " + " | ".join(t.header) + " |")
        out.append("|" + "|".join("---" for _ in t.header) + "|")
        for row in t.rows:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        if t.note:
            out.append(f"\n_{t.note}_")
        out.append("")
    return "\n".join(out)


def to_html(tables: Sequence[Table]) -> str:
    parts = []
    for t in tables:
        parts.append(f"<h3>{esc(t.title)}</h3>")
        parts.append(table(t.header, t.rows, numeric=False))
        if t.note:
            parts.append(f'<p class="muted">{esc(t.note)}</p>')
    return "".join(parts)


TRANSCRIPT_CHARS = 1500
"""Longest text of one transcript block in eval.md and the report (the whole is in
completions.jsonl)."""


def _transcript_title(result: EvalResult, shown: TranscriptSample) -> str:
    at = shown.prompt_index
    prompt = shorten(result.prompts[at].prompt) if at < len(result.prompts) else "?"
    return f"{shown.model}, prompt {at} ({prompt}), sample {shown.sample}"


def transcripts_markdown(result: EvalResult) -> str:
    """The eval's transcripts as Markdown, tool calls and results marked; empty without tools."""
    if not result.transcripts:
        return ""
    out = [
        "### Transcripts",
        "",
        "_>> tool call, << tool result, !! failed call; every sample's transcript is in "
        "completions.jsonl_",
        "",
    ]
    for shown in result.transcripts:
        out += [f"**{_transcript_title(result, shown)}**", ""]
        out += [transcripts.to_markdown(shown.messages, max_chars=TRANSCRIPT_CHARS), ""]
    return "\n".join(out)


def transcripts_html(result: EvalResult) -> str:
    """The eval's transcripts as HTML (tool calls and results styled apart); empty without."""
    if not result.transcripts:
        return ""
    parts = ["<h3>Transcripts</h3>"]
    for shown in result.transcripts:
        parts.append(
            f'<div class="sample"><div class="meta">{esc(_transcript_title(result, shown))}</div>'
            f"{transcripts.to_html(shown.messages, max_chars=TRANSCRIPT_CHARS)}</div>"
        )
    return "".join(parts)
