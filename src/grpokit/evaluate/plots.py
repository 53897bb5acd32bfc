"""The report's figures: matplotlib (Agg, no display), one figure per report section.

Figures are built on ``matplotlib.figure.Figure`` directly, not pyplot, so that no global state or
GUI backend is involved and reports can be built from any thread.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib.colors
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from grpokit.evaluate.rundir import RunData
from grpokit.monitor.series import ema

WIDTH = 11.0
"""Figure width in inches; at 100 dpi a figure fits a laptop screen next to nothing else."""
DPI = 100
ALERT_COLOR = "#d62728"


def smoothing_for(n_steps: int) -> float:
    """EMA weight of history: light for short runs, heavier for long ones (0.6 .. 0.95)."""
    return min(0.95, max(0.6, 1 - 10 / max(n_steps, 1)))


def png_bytes(fig: Figure) -> bytes:
    """Render a figure to PNG."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _xy(steps: Sequence[int], values: Sequence[float | None]) -> tuple[list[int], list[float]]:
    pairs = [(s, v) for s, v in zip(steps, values, strict=True) if v is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_metric(
    ax: Axes,
    run: RunData,
    key: str,
    *,
    label: str | None = None,
    color: str | None = None,
    smooth: float | None = None,
    raw: bool = True,
) -> bool:
    """One metric as a faint raw line and its EMA; False when the run lacks it."""
    steps, values = run.series(key)
    x, y = _xy(steps, values)
    if not x:
        return False
    alpha = smoothing_for(len(x)) if smooth is None else smooth
    if raw and alpha > 0:
        (line,) = ax.plot(x, y, color=color, alpha=0.25, linewidth=1)
        color = matplotlib.colors.to_hex(line.get_color())
    sx, sy = _xy(x, ema(y, alpha))
    ax.plot(sx, sy, color=color, linewidth=2, label=label or key)
    return True


def mark_alerts(ax: Axes, alerts: Sequence[dict[str, Any]], *, labels: bool = False) -> None:
    """Vertical lines at the steps where monitors fired; rule names on top when ``labels``."""
    seen: set[int] = set()
    for alert in alerts:
        step = alert.get("step")
        if not isinstance(step, int):
            continue
        ax.axvline(step, color=ALERT_COLOR, linestyle=":", linewidth=1.2, alpha=0.8)
        if labels:
            offset = 0.98 - 0.12 * (len([s for s in seen if s == step]))
            ax.text(
                step,
                offset,
                f" {alert.get('rule', '?')}",
                transform=ax.get_xaxis_transform(),
                rotation=90,
                va="top",
                ha="right",
                fontsize=8,
                color=ALERT_COLOR,
            )
        seen.add(step)


def _finish(ax: Axes, title: str, ylabel: str | None = None, *, legend: bool = True) -> None:
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    if legend and handles:
        ax.legend(fontsize=8, loc="best")


def _empty(ax: Axes, title: str, why: str) -> None:
    ax.set_title(title, fontsize=11)
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="#777")
    ax.set_xticks([])
    ax.set_yticks([])


def fig_rewards(run: RunData, alerts: Sequence[dict[str, Any]]) -> Figure:
    """Total reward (left) and each reward function (right), raw and smoothed."""
    fig = Figure(figsize=(WIDTH, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    plot_metric(left, run, "reward", label="reward (EMA)", color="#1f77b4")
    mark_alerts(left, alerts, labels=True)
    _finish(left, "Total reward (weighted sum)")
    names = run.reward_names()
    for name in names:
        plot_metric(right, run, f"rewards/{name}/mean", label=name)
    if names:
        mark_alerts(right, alerts)
        _finish(right, "Reward per function (mean)")
    else:
        _empty(right, "Reward per function", "no rewards/<name>/mean in metrics")
    return fig


def fig_dynamics(run: RunData, alerts: Sequence[dict[str, Any]]) -> Figure:
    """KL (to the reference, and between the sampler and the trainer), entropy,
    frac_reward_zero_std and the shares of clipped or corrected tokens, 2 x 2."""
    fig = Figure(figsize=(WIDTH, 5.6), layout="constrained")
    axes = fig.subplots(2, 2)
    panels: list[tuple[Axes, str, list[tuple[str, str]]]] = [
        (
            axes[0][0],
            "KL to the reference; sampler vs trainer",
            [("kl", "kl"), ("mismatch/kl", "mismatch/kl")],
        ),
        (axes[0][1], "Entropy (nats / token)", [("entropy", "entropy")]),
        (
            axes[1][0],
            "Share of groups with equal rewards",
            [("frac_reward_zero_std", "frac_reward_zero_std")],
        ),
        (
            axes[1][1],
            "Clipped or corrected tokens",
            [
                ("clip_ratio/low_mean", "low"),
                ("clip_ratio/high_mean", "high"),
                ("clip_ratio/region_mean", "region"),
                ("cispo_clip_ratio", "cispo cap"),
                ("mismatch/masked_frac", "mismatch masked"),
                ("mismatch/truncated_frac", "mismatch truncated"),
            ],
        ),
    ]
    for ax, title, keys in panels:
        drawn = [plot_metric(ax, run, key, label=label) for key, label in keys]
        if any(drawn):
            mark_alerts(ax, alerts)
            _finish(ax, title, legend=len(keys) > 1)
        else:
            why = "beta = 0: no reference model" if keys[0][0] == "kl" else "not logged"
            _empty(ax, title, why)
    return fig


def fig_lengths(run: RunData, alerts: Sequence[dict[str, Any]]) -> Figure:
    """Completion lengths with truncation (left), repetition metrics (right)."""
    fig = Figure(figsize=(WIDTH, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    steps, lo = run.series("completions/min_length")
    _, hi = run.series("completions/max_length")
    band = [
        (s, a, b) for s, a, b in zip(steps, lo, hi, strict=True) if a is not None and b is not None
    ]
    if band:
        left.fill_between(
            [b[0] for b in band],
            [b[1] for b in band],
            [b[2] for b in band],
            color="#1f77b4",
            alpha=0.12,
            label="min - max",
        )
    plot_metric(left, run, "completions/mean_length", label="mean", color="#1f77b4")
    plot_metric(
        left,
        run,
        "completions/mean_terminated_length",
        label="mean (terminated)",
        color="#2ca02c",
        raw=False,
    )
    mark_alerts(left, alerts)
    _finish(left, "Completion length (tokens)")
    x, y = _xy(*run.series("completions/clipped_ratio"))
    if x:
        twin = left.twinx()
        twin.plot(x, y, color="#ff7f0e", linewidth=1, linestyle="--", label="truncated share")
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("truncated share", color="#ff7f0e")
        twin.legend(fontsize=8, loc="lower right")
    keys = [
        ("completions/repeated_ngram_frac", "repeated n-gram share"),
        ("completions/distinct_2", "distinct-2"),
        ("completions/max_group_duplicate_frac", "max group duplicate share"),
    ]
    if any([plot_metric(right, run, k, label=label) for k, label in keys]):
        right.set_ylim(-0.02, 1.02)
        mark_alerts(right, alerts)
        _finish(right, "Repetition in completions")
    else:
        _empty(right, "Repetition in completions", "not logged")
    return fig


PHASES = (("time/generate", "generate"), ("time/score", "score"), ("time/update", "update"))


def fig_timing(run: RunData) -> Figure | None:
    """Seconds per step by phase, stacked; None when the run logs no phase times."""
    steps = run.steps
    series = [(label, run.series(key)[1]) for key, label in PHASES if run.has(key)]
    if not series:
        return None
    fig = Figure(figsize=(WIDTH, 3.2), layout="constrained")
    ax = fig.subplots()
    bottom = [0.0] * len(steps)
    for label, values in series:
        heights = [v or 0.0 for v in values]
        ax.bar(steps, heights, bottom=bottom, label=label, width=0.9)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    x, y = _xy(*run.series("step_time"))
    if x:
        ax.plot(x, y, color="black", linewidth=1, label="step_time")
    _finish(ax, "Time per step by phase (seconds)", "s")
    return fig


def fig_pass_rates(run: RunData, names: Sequence[str]) -> Figure | None:
    """Observed pass rates against the preflight forecast and held-out checks, one panel a reward."""
    panels = [
        n
        for n in names
        if run.has(f"pass_rate/{n}")
        or run.has(f"forecast/{n}/pass_rate")
        or run.has(f"eval/{n}/pass_rate")
    ]
    if not panels:
        return None
    fig = Figure(figsize=(WIDTH, 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, name in zip(axes, panels, strict=True):
        plot_metric(ax, run, f"pass_rate/{name}", label="training (at max, EMA)")
        fx, fy = _xy(*run.series(f"forecast/{name}/pass_rate"))
        if fx:
            ax.plot(fx, fy, color="#2ca02c", linestyle="--", linewidth=2, label="forecast")
        ex, ey = _xy(*run.series(f"eval/{name}/pass_rate"))
        if ex:
            ax.plot(ex, ey, "o-", color="#9467bd", label="held-out")
        ax.set_ylim(-0.02, 1.02)
        _finish(ax, f"Pass rate: {name}")
    return fig


def fig_heldout(
    run: RunData, names: Sequence[str], alerts: Sequence[dict[str, Any]]
) -> Figure | None:
    """Held-out eval mean reward against the training mean, per reward."""
    panels = [n for n in names if run.has(f"eval/{n}/mean")]
    if not panels:
        return None
    fig = Figure(figsize=(WIDTH, 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, name in zip(axes, panels, strict=True):
        plot_metric(ax, run, f"rewards/{name}/mean", label="training (EMA)")
        ex, ey = _xy(*run.series(f"eval/{name}/mean"))
        ax.plot(ex, ey, "o-", color="#9467bd", label="held-out")
        mark_alerts(ax, [a for a in alerts if a.get("rule") == "heldout_divergence"])
        _finish(ax, f"Held-out vs training: {name}")
    return fig


COMPARE_KEYS = (
    ("reward", "Total reward"),
    ("kl", "KL"),
    ("entropy", "Entropy"),
    ("frac_reward_zero_std", "Equal-reward groups"),
    ("completions/mean_length", "Mean length (tokens)"),
    ("completions/clipped_ratio", "Truncated share"),
    ("completions/repeated_ngram_frac", "Repeated n-gram share"),
    ("completions/distinct_2", "Distinct-2"),
    ("completions/max_group_duplicate_frac", "Max group duplicate share"),
)


def fig_compare(
    runs: Sequence[RunData],
    labels: Sequence[str],
    keys: Sequence[tuple[str, str]],
    *,
    points: bool = False,
) -> Figure:
    """Several runs overlaid, one panel per metric, each run's alerts as dotted lines in its
    colour. Smoothed curves; with ``points``, the logged values joined (sparse metrics such as
    the periodic held-out eval)."""
    cols = 3
    rows = max(1, -(-len(keys) // cols))
    fig = Figure(figsize=(WIDTH, 2.9 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for i, (key, title) in enumerate(keys):
        ax = axes[i // cols][i % cols]
        drawn = []
        for run, label, color in zip(runs, labels, colors, strict=True):
            if points:
                x, y = _xy(*run.series(key))
                if x:
                    ax.plot(x, y, "o-", color=color, linewidth=1.5, markersize=4, label=label)
                drawn.append(bool(x))
            else:
                drawn.append(plot_metric(ax, run, key, label=label, color=color, raw=False))
            for step in sorted({a["step"] for a in run.alerts() if isinstance(a.get("step"), int)}):
                ax.axvline(step, color=color, linestyle=":", linewidth=1.2, alpha=0.8)
        if any(drawn):
            _finish(ax, title, legend=i == 0)
        else:
            _empty(ax, title, "not logged")
    for j in range(len(keys), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    return fig
