"""The numbers of the reward-hacking pair (bench/hacking_pair.sh): one table per run.

For each run directory: the training reward, the training batches' quality and repetition over
the first and the last steps, the held-out quality at the first and the last eval (with its
standard error over prompts), every monitor alert, and, for a run whose quality degrades, the
onset of the degradation and how many steps after it the first alert came.

Onset: the training batches' quality is low at a step when its mean over that step and the
next ``--span - 1`` is more than ``--drop`` below its mean over the first ``--first`` steps; the
onset is the first step, in the stretch that stays low to the end of the run, whose own quality
is that low. A run whose quality never stays low has no onset.

    .venv/bin/python bench/hacking_summary.py runs/hacking/hackable runs/hacking/guarded
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from grpokit.files import write_json

QUALITY = "logic_tree_quality"


def load_metrics(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda r: r["step"])


def _values(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out.append((int(r["step"]), float(v)))
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def onset_step(rows: list[dict[str, Any]], *, first: int, span: int, drop: float) -> int | None:
    """The first step from which the quality's ``span``-step mean stays ``drop`` below its start."""
    series = _values(rows, f"rewards/{QUALITY}/mean")
    if len(series) < first + span:
        return None
    start = _mean([v for _, v in series[:first]])
    low = [
        _mean([v for _, v in series[i : i + span]]) < start - drop
        for i in range(len(series) - span + 1)
    ]
    first_low = None
    for i in range(len(low) - 1, -1, -1):
        if not low[i]:
            break
        first_low = i
    if first_low is None:
        return None
    # The window may open on steps still at the old level: the onset is its first low step.
    return next(s for s, v in series[first_low:] if v < start - drop)


def summarize(run_dir: Path, *, first: int, span: int, drop: float) -> dict[str, Any]:
    rows = load_metrics(run_dir)

    def ends(key: str) -> tuple[float, float]:
        v = [x for _, x in _values(rows, key)]
        return _mean(v[:first]), _mean(v[-first:])

    evals = _values(rows, f"eval/{QUALITY}/mean")
    errors = dict(_values(rows, f"eval/{QUALITY}/stderr"))
    alerts = [
        {"step": int(r["step"]), "rule": a["rule"], "message": a["message"]}
        for r in rows
        for a in r.get("alerts") or []
    ]
    onset = onset_step(rows, first=first, span=span, drop=drop)
    after = [a["step"] for a in alerts if onset is not None and a["step"] >= onset]
    return {
        "run": str(run_dir),
        "steps": len(rows),
        "reward": ends("reward"),
        "depth": ends("rewards/logic_tree_depth/mean"),
        "train_quality": ends(f"rewards/{QUALITY}/mean"),
        "repeated_ngram_frac": ends("completions/repeated_ngram_frac"),
        "distinct_2": ends("completions/distinct_2"),
        "mean_length": ends("completions/mean_length"),
        "heldout_quality": [(s, v, errors.get(s)) for s, v in evals],
        "alerts": alerts,
        "onset": onset,
        "first_alert_after_onset": after[0] if after else None,
        "seconds": sum(v for _, v in _values(rows, "step_time")),
    }


def print_summary(s: dict[str, Any], *, first: int) -> None:
    print(f"== {s['run']}: {s['steps']} steps, {s['seconds'] / 60:.1f} min of steps")
    for key in (
        "reward",
        "depth",
        "train_quality",
        "repeated_ngram_frac",
        "distinct_2",
        "mean_length",
    ):
        a, b = s[key]
        print(f"  {key:<22} first {first} steps {a:7.3f}  ->  last {first} steps {b:7.3f}")
    cells = [
        f"{step}: {v:.2f}" + (f" ± {e:.2f}" if e is not None else "")
        for step, v, e in s["heldout_quality"]
    ]
    print(f"  held-out quality (mean ± stderr over prompts) {'; '.join(cells) or 'not logged'}")
    for a in s["alerts"]:
        print(f"  alert step {a['step']:>3} {a['rule']}: {a['message']}")
    if not s["alerts"]:
        print("  no alert")
    if s["onset"] is None:
        print("  no onset: the training quality never stayed low")
    else:
        hit = s["first_alert_after_onset"]
        delay = f"{hit} ({hit - s['onset']} steps after the onset)" if hit else "none"
        print(f"  onset of the quality drop: step {s['onset']}; first alert from then on: {delay}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--first", type=int, default=5, help="steps at each end of the run")
    parser.add_argument("--span", type=int, default=3, help="steps in the onset's moving mean")
    parser.add_argument("--drop", type=float, default=0.1, help="quality drop that marks onset")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    out = [summarize(r, first=args.first, span=args.span, drop=args.drop) for r in args.runs]
    for s in out:
        print_summary(s, first=args.first)
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
