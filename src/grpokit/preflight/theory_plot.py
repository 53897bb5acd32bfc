"""`grpokit theory`: the success-amplification iteration as a table and a PNG of h(p)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpokit.core.theory import FixedPoint, fixed_point, fixed_points, h, h_prime, iterate
from grpokit.errors import UserError


@dataclass(frozen=True)
class TheoryResult:
    """iterates: p_0 = p_ref, p_1, ...; limit: where the iteration from p_ref settles (None if it
    oscillates); points: every fixed point with h'(p*); no_std: the fixed point without std
    normalisation (reached in one step)."""

    p_ref: float
    beta: float
    eps: float
    iterates: list[float]
    limit: float | None
    points: list[FixedPoint]
    no_std: float


def check_arguments(p_ref: float, beta: float, eps: float, steps: int) -> None:
    if not 0.0 <= p_ref <= 1.0:
        raise UserError(f"--p-ref must be a probability in [0, 1], got {p_ref}")
    if beta == 0.0:
        raise UserError(
            "--beta 0: without a KL term the optimum is degenerate: p* = 1 for any p_ref > 0 "
            "(and 0 for p_ref = 0), reached in one step. Give a beta > 0 to see the iteration."
        )
    if beta < 0.0:
        raise UserError(f"--beta must be > 0, got {beta}")
    if eps <= 0.0:
        raise UserError(f"--eps must be > 0 (the std floor), got {eps}")
    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")


def compute(p_ref: float, *, beta: float, eps: float = 1e-6, steps: int = 10) -> TheoryResult:
    check_arguments(p_ref, beta, eps, steps)
    try:
        limit: float | None = fixed_point(p_ref, beta=beta, eps=eps)
    except RuntimeError:
        limit = None
    return TheoryResult(
        p_ref=p_ref,
        beta=beta,
        eps=eps,
        iterates=iterate(p_ref, beta=beta, n_steps=steps, eps=eps),
        limit=limit,
        points=fixed_points(p_ref, beta=beta, eps=eps),
        no_std=fixed_point(p_ref, beta=beta, eps=eps, std_normalized=False),
    )


def table_lines(r: TheoryResult) -> list[str]:
    """The iteration table and the fixed points, as printed by `grpokit theory`."""
    lines = [
        f"success amplification: p_ref = {r.p_ref:g}, beta = {r.beta:g}, eps = {r.eps:g}",
        "  n   p_n            1 - p_n      h'(p_n)",
    ]
    for n, p in enumerate(r.iterates):
        slope = h_prime(p, p_ref=r.p_ref, beta=r.beta, eps=r.eps)
        lines.append(f"  {n:<3d} {p:.10f}  {1.0 - p:.3e}  {slope:+.4f}")
    limit = "does not settle (oscillates)" if r.limit is None else f"{r.limit:.7f}"
    lines.append(f"limit of the iteration from p_ref: p* = {limit}")
    if r.points:
        lines.append("fixed points of h (p* = h(p*)):")
        for fp in r.points:
            kind = "stable" if fp.stable else "unstable"
            lines.append(
                f"  p* = {fp.p:.7f}  logit {fp.logit:.4g}  h'(p*) = {fp.derivative:+.4f}  {kind}"
            )
    lines.append(
        f"without std normalisation (A = r - p): h is constant, p* = {r.no_std:.5f} after one step"
    )
    lines.append(
        "This is the idealised optimum of the KL-regularised objective at every iteration "
        "(Mroueh 2025; docs/math.md section 5), not a promise of what a finite run reaches."
    )
    return lines


def plot(r: TheoryResult, path: Path, *, grid: int = 801) -> Path:
    """Draw h(p), the diagonal, the fixed points and the iteration from p_ref into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    ps = [i / (grid - 1) for i in range(grid)]
    hs = [h(p, p_ref=r.p_ref, beta=r.beta, eps=r.eps) for p in ps]
    fig = Figure(figsize=(6.4, 5.2), layout="constrained")
    ax = fig.subplots()
    ax.plot(ps, hs, color="#1f77b4", linewidth=2, label="h(p), std-normalised")
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="p = h(p)")
    ax.axhline(
        r.no_std,
        color="#ff7f0e",
        linestyle="--",
        linewidth=1.5,
        label=f"h without std: {r.no_std:.3f}",
    )
    ax.axhline(r.p_ref, color="#2ca02c", linestyle="-.", linewidth=1, label=f"p_ref = {r.p_ref:g}")
    # The cobweb: (p_n, p_n) -> (p_n, p_{n+1}) -> (p_{n+1}, p_{n+1}).
    xs, ys = [r.iterates[0]], [r.iterates[0]]
    for a, b in zip(r.iterates, r.iterates[1:], strict=False):
        xs += [a, b]
        ys += [b, b]
    ax.plot(xs, ys, color="#d62728", linewidth=1, alpha=0.8, label="iteration from p_ref")
    for fp in r.points:
        kind = "stable" if fp.stable else "unstable"
        ax.plot(
            [fp.p],
            [fp.p],
            "o",
            markersize=9,
            color="black",
            markerfacecolor="black" if fp.stable else "white",
            label=f"p* = {fp.p:.4f} ({kind}, h' = {fp.derivative:.3f})",
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("p  (success probability of the current policy)")
    ax.set_ylabel("h(p)  (after one GRPO iteration)")
    ax.set_title(
        f"Success amplification: p_ref = {r.p_ref:g}, beta = {r.beta:g}\n"
        "idealised optimum of the KL-regularised objective, not a promise",
        fontsize=10,
    )
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
