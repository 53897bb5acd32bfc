"""preflight.json and the console table.

preflight.json (schema ``grpokit.preflight/1``), written atomically::

    {
      "schema": "grpokit.preflight/1",
      "created": "2025-01-01T12:00:00+00:00",
      "config": "/abs/config.yaml",        "model": "smollm2-135m-instruct",
      "init_from": "/abs/sft" | null,      "seconds": 21.4,
      "settings": {prompts, generations, samples, temperature, top_p, top_k,
                   max_completion_length, beta, scale_rewards, seed},
      "verdict": {"status": "go" | "low_signal" | "cold_start" | "saturated", "exit_code": 0 | 1,
                  "reasons": [...], "advice": [...], "notes": [...]},
      "total": {"mean": float | null, "zero_variance_share": float},
      "completions": {mean_length, min_length, max_length, truncated_share,
                      mean_terminated_length, entropy, distinct_share},
      "rewards": {"<name>": {
          "type", "max_value", "samples", "applicable", "mean", "passed",
          "measured_pass_rate", "pass_rate_interval": [low, high],
          "zero_variance_share", "none_share", "gated_out_share",
          "forecast": p* under the configured scaling | null,
          "forecast_interval": [p* at low, p* at high], "forecast_with_std",
          "forecast_without_std", "forecast_std_normalized", "beta"}},
      "partial_credit": [{"reward", "type", "tags", "mean", "zero_variance_share"}],
      "tools": null | {"names", "format", "lenient", "chat_template", "completions",
                       "calling", "call_rate", "call_rate_interval": [low, high], "calls",
                       "failed", "unparsed", "unparsed_calls"},
      "parts": {<part>: {"reward", "scored", "mean", "passed", "pass_rate_interval"}},
      "examples": [{"completion", "finish_reason", "rewards": {...}}]
    }

Pass-rate fields are null for rewards without a maximum. NaN is written as null. ``tools`` is
null without tools; ``calling`` counts completions that called one, ``unparsed`` those that
wrote a call outside the format (run only when ``lenient``).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.table import Table

from grpokit.core.forecast import FORECAST_EPS
from grpokit.preflight.measure import Measurement, RewardStats, ToolStats
from grpokit.preflight.verdict import Verdict

SCHEMA = "grpokit.preflight/1"

DISCLAIMER = (
    "The forecast is the idealised optimum of the KL-regularised GRPO objective iterated from the "
    "measured pass rate (success amplification, Mroueh 2025; docs/math.md section 5): a reference "
    "point to hold training against, not a promise."
)


def _num(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


def _reward_json(m: Measurement, r: RewardStats) -> dict[str, Any]:
    info = m.info(r.name)
    fc = r.forecast
    return {
        "type": info.type,
        "max_value": info.max_value,
        "samples": r.samples,
        "applicable": r.applicable,
        "mean": _num(r.mean),
        "passed": r.passed,
        "measured_pass_rate": r.pass_rate,
        "pass_rate_interval": list(r.interval) if r.interval else None,
        "zero_variance_share": r.zero_variance_share,
        "none_share": r.none_share,
        "gated_out_share": r.gated_out_share,
        "forecast": fc.p_star if fc else None,
        "forecast_interval": [fc.p_star_low, fc.p_star_high] if fc else None,
        "forecast_with_std": fc.with_std if fc else None,
        "forecast_without_std": fc.without_std if fc else None,
        "forecast_std_normalized": fc.std_normalized if fc else None,
        "beta": m.settings.beta,
    }


def _tools_json(t: ToolStats | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {
        "names": list(t.info.names),
        "format": t.info.format,
        "lenient": t.info.lenient,
        "chat_template": t.info.chat_template,
        "completions": t.completions,
        "calling": t.calling,
        "call_rate": t.call_rate,
        "call_rate_interval": list(t.interval),
        "calls": t.calls,
        "failed": t.failed,
        "unparsed": t.unparsed,
        "unparsed_calls": t.unparsed_calls,
    }


def tool_line(t: ToolStats) -> str:
    """The console's line on tool use: the call rate, and the calls written outside the format."""
    low, high = t.interval
    line = (
        f"tool calls: {t.calling}/{t.completions} completions called {', '.join(t.info.names)} "
        f"({t.call_rate:.1%}, 95% CI {low:.1%}-{high:.1%}; {t.calls} calls, {t.failed} failed)"
    )
    if t.unparsed:
        fmt = f"the {t.info.format} format" if t.info.format else "the format"
        ran = "run: training.tool_call_lenient" if t.info.lenient else "not run"
        line += f"; {t.unparsed} wrote {t.unparsed_calls} call(s) outside {fmt} ({ran})"
    return line


def preflight_json(
    m: Measurement, v: Verdict, *, meta: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The preflight.json document (see the module docstring)."""
    settings = asdict(m.settings)
    settings.pop("system_prompt")
    settings["samples"] = m.settings.samples
    completions = {
        k: _num(x) if isinstance(x, float) else x for k, x in asdict(m.completions).items()
    }
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **(meta or {}),
        "settings": settings,
        "verdict": {
            "status": v.status,
            "exit_code": v.exit_code,
            "reasons": v.reasons,
            "advice": v.advice,
            "notes": v.notes,
        },
        "total": {"mean": _num(m.total_mean), "zero_variance_share": m.total_zero_variance_share},
        "completions": completions,
        "rewards": {r.name: _reward_json(m, r) for r in m.rewards},
        "partial_credit": [{**asdict(pc), "tags": list(pc.tags)} for pc in m.partial_credit],
        "tools": _tools_json(m.tools),
        "parts": {
            p.name: {
                "reward": p.reward,
                "scored": p.scored,
                "mean": _num(p.mean),
                "passed": p.passed,
                "pass_rate_interval": list(p.interval),
            }
            for p in m.parts
        },
        "examples": m.examples,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.1%}"


def reward_rows(m: Measurement) -> list[list[str]]:
    """The table's rows: reward, mean, passed, 95% CI, flat groups, None, gated out."""
    rows = []
    for r in m.rewards:
        passed = "-" if r.passed is None else f"{r.passed}/{r.applicable}"
        ci = "-" if r.interval is None else f"{r.interval[0]:.1%}-{r.interval[1]:.1%}"
        rows.append(
            [
                r.name,
                "-" if math.isnan(r.mean) else f"{r.mean:.3f}",
                passed,
                ci,
                f"{r.zero_variance_share:.0%}",
                f"{r.none_share:.0%}",
                f"{r.gated_out_share:.0%}",
            ]
        )
        # Its parts (a checklist's items) below it, over the samples it scored; "at max" is
        # the share at 0.5 or above.
        for p in (p for p in m.parts if p.reward == r.name):
            rows.append(
                [
                    f"  {p.name.rpartition('/')[2]}",
                    "-" if math.isnan(p.mean) else f"{p.mean:.3f}",
                    f"{p.passed}/{p.scored}",
                    f"{p.interval[0]:.1%}-{p.interval[1]:.1%}" if p.scored else "-",
                    "",
                    "",
                    "",
                ]
            )
    return rows


def forecast_lines(m: Measurement) -> list[str]:
    """One line per reward with a maximum: measured rate against the forecast p*."""
    lines = []
    s = m.settings
    used = "std-normalised" if s.scale_rewards != "none" else "not std-normalised"
    for r in m.rewards:
        fc = r.forecast
        if fc is None or r.interval is None:
            continue
        if r.passed == 0:
            lines.append(
                f"{r.name}: measured 0/{r.applicable} -> forecast p* = 0: nothing to amplify "
                f"(cold start); at the interval's upper end {r.interval[1]:.1%} it would be "
                f"{_pct(fc.p_star_high)}"
            )
            continue
        line = (
            f"{r.name}: measured {_pct(r.pass_rate)} ({r.interval[0]:.1%}-{r.interval[1]:.1%}) "
            f"-> forecast p* {_pct(fc.p_star)} ({_pct(fc.p_star_low)}-{_pct(fc.p_star_high)}) "
            f"with beta {s.beta:g}, advantages {used} (scale_rewards: {s.scale_rewards}); "
            f"with std {_pct(fc.with_std)}, without {_pct(fc.without_std)}"
        )
        lines.append(line)
    if lines and s.beta == 0.0:
        lines.append(
            "beta = 0: without a KL term the optimum is degenerate: p* = 1 for any measured rate "
            "above 0 (0 stays 0). Set training.beta > 0 for an informative forecast."
        )
    if lines:
        lines.append(f"(eps = {FORECAST_EPS:g} inside the std.) " + DISCLAIMER)
    return lines


def completions_line(m: Measurement) -> str:
    """Lengths, truncation, entropy and distinctness of the samples, in one line. The length of
    the completions that ended by EOS is a mean, said as one: "ended by EOS 31" read as a count."""
    s, c = m.settings, m.completions
    if c.mean_terminated_length is None:
        eos = "none ended by EOS"
    else:
        eos = f"mean {c.mean_terminated_length:.0f} of those ended by EOS"
    ent = "-" if c.entropy is None else f"{c.entropy:.2f}"
    return (
        f"completions: mean length {c.mean_length:.0f} tokens (min {c.min_length}, max "
        f"{c.max_length}; {eos}); truncated at {s.max_completion_length}: "
        f"{c.truncated_share:.0%}; entropy {ent} nats/token; distinct per group "
        f"{c.distinct_share:.0%}"
    )


def render(m: Measurement, v: Verdict, console: Console, *, title: str = "preflight") -> None:
    """Print the table, the forecast and the verdict with its advice."""
    s = m.settings
    table = Table(
        title=f"{title}: {s.prompts} prompts x {s.generations} generations = {s.samples} samples, "
        f"temperature {s.temperature:g}"
    )
    for col in ("reward", "mean", "at max", "95% CI", "flat groups", "None", "gated out"):
        table.add_column(col, justify="left" if col == "reward" else "right")
    for row in reward_rows(m):
        table.add_row(*row)
    table.add_row(
        "total",
        "-" if math.isnan(m.total_mean) else f"{m.total_mean:.3f}",
        "",
        "",
        f"{m.total_zero_variance_share:.0%}",
        "",
        "",
        style="bold",
    )
    console.print(table)
    console.print(completions_line(m), markup=False)
    if m.tools is not None:
        console.print(tool_line(m.tools), markup=False, highlight=False)
    console.print(
        f"flat groups = share of the {s.prompts} groups whose values are all equal: they give no "
        "gradient (the total column is what training sees, TRL's frac_reward_zero_std)."
    )
    lines = forecast_lines(m)
    if lines:
        console.print("[bold]forecast[/]")
        for line in lines:
            console.print(f"  {line}", markup=False, highlight=False)
    colour = {"go": "green", "low_signal": "yellow", "cold_start": "red", "saturated": "red"}
    console.print(v.headline, style=f"bold {colour[v.status]}", markup=False)
    for reason in v.reasons:
        console.print(f"  - {reason}", markup=False, highlight=False)
    if v.advice:
        console.print("[bold]options[/]")
        for i, item in enumerate(v.advice, 1):
            console.print(f"  {i}. {item}", markup=False, highlight=False)
    for note in v.notes:
        console.print(f"  note: {note}", markup=False, highlight=False)
