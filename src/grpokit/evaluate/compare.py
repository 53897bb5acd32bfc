"""``grpokit compare``: the key curves of several runs overlaid, and how their configs differ."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpokit.errors import UserError
from grpokit.evaluate import plots
from grpokit.evaluate.html import esc, img, page, section, table
from grpokit.evaluate.rundir import RunData, load_run
from grpokit.files import write_atomic

MAX_REWARD_PANELS = 6


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Short unique labels: the directory names, with parents added where names repeat."""
    labels = [p.name for p in run_dirs]
    if len(set(labels)) == len(labels):
        return labels
    return [f"{p.parent.name}/{p.name}" if labels.count(p.name) > 1 else p.name for p in run_dirs]


def _flat(value: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(_flat(v, f"{prefix}[{i}]"))
        return out
    return {prefix: str(value)}


def config_differences(runs: Sequence[RunData]) -> list[list[object]]:
    """Rows (key, value per run) for every config key whose value is not the same in all runs."""
    flats = [_flat(r.config) for r in runs]
    keys = sorted({k for f in flats for k in f})
    rows: list[list[object]] = []
    for key in keys:
        values = [f.get(key, "(unset)") for f in flats]
        if len(set(values)) > 1:
            rows.append([key, *values])
    return rows


def _alerts_table(runs: Sequence[RunData], labels: Sequence[str]) -> str:
    """Every run's alerts in step order: which rule fired when, and its evidence."""
    rows: list[list[object]] = [
        [label, a.get("step"), a.get("rule", "?"), str(a.get("message", ""))]
        for label, r in zip(labels, runs, strict=True)
        for a in r.alerts()
    ]
    if not rows:
        return '<p class="muted">No monitor fired in any run.</p>'
    return table(["run", "step", "rule", "evidence"], rows)


def compare_runs(run_dirs: list[Path], out: Path) -> Path:
    """Write an HTML page with the key curves of the runs overlaid; PNGs next to it.

    Args:
        run_dirs: two or more run directories.
        out: the HTML file; the PNGs go to ``<out stem>_plots/`` beside it.
    """
    if len(run_dirs) < 2:
        raise UserError("compare needs at least two run directories")
    runs = [load_run(Path(d)) for d in run_dirs]
    labels = run_labels([Path(d) for d in run_dirs])
    out = Path(out)
    plot_dir = out.parent / f"{out.stem}_plots"
    parts = [f"<h1>grpokit: {len(runs)} runs compared</h1>"]
    skipped = [(label, s) for label, r in zip(labels, runs, strict=True) for s in r.skipped]
    if skipped:
        items = "".join(f"<li>{esc(label)}: {esc(s)}</li>" for label, s in skipped[:10])
        parts.append(f'<div class="warn">Skipped unreadable lines:<ul>{items}</ul></div>')
    parts.append(
        section(
            "runs",
            "Runs",
            table(
                ["label", "directory", "steps", "alerts"],
                [
                    [label, str(r.run_dir), len(r.metrics), len(r.alerts())]
                    for label, r in zip(labels, runs, strict=True)
                ],
            ),
        )
    )
    key_fig = plots.fig_compare(runs, labels, plots.COMPARE_KEYS)
    data = plots.png_bytes(key_fig)
    write_atomic(plot_dir / "key_curves.png", data)
    parts.append(section("curves", "Key curves (smoothed)", img(data, "key curves")))
    shared = [n for n in runs[0].reward_names() if all(n in r.reward_names() for r in runs[1:])]
    if shared:
        keys = [(f"rewards/{n}/mean", f"reward: {n}") for n in shared[:MAX_REWARD_PANELS]]
        data = plots.png_bytes(plots.fig_compare(runs, labels, keys))
        write_atomic(plot_dir / "rewards.png", data)
        parts.append(section("rewards", "Rewards present in every run", img(data, "rewards")))
    evals = [
        (f"eval/{n}/mean", f"held-out: {n}")
        for n in shared
        if any(r.has(f"eval/{n}/mean") for r in runs)
    ]
    if evals:
        data = plots.png_bytes(
            plots.fig_compare(runs, labels, evals[:MAX_REWARD_PANELS], points=True)
        )
        write_atomic(plot_dir / "heldout.png", data)
        parts.append(
            section(
                "heldout",
                "Held-out eval (training.eval_steps), rewards present in every run",
                img(data, "held-out eval"),
            )
        )
    parts.append(section("alerts", "Monitor alerts", _alerts_table(runs, labels)))
    diffs = config_differences(runs)
    parts.append(
        section(
            "config",
            "Config differences",
            table(["key", *labels], diffs, numeric=False)
            if diffs
            else '<p class="muted">The configs are identical.</p>',
        )
    )
    write_atomic(out, page("grpokit compare", "".join(parts)).encode("utf-8"))
    return out
