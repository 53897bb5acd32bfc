"""Small statistics on plain Python floats, for preflight checks and evaluation tables."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "Z_95",
    "pass_at_k",
    "paired_difference",
    "t_quantile_975",
    "wilson_interval",
    "zero_variance_share",
]

Z_95 = 1.959963984540054
"""Two-sided 95% standard normal quantile."""


def _check_z(z: float) -> None:
    if not z > 0.0:
        raise ValueError(f"z must be > 0, got {z!r}")


def wilson_interval(successes: int, n: int, *, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval (low, high) for a binomial proportion successes / n.

    Unlike the normal (Wald) interval it stays inside [0, 1] and is not degenerate at 0 or n
    successes, which is the usual case for a base model on a strict format (0/32).
    n = 0 carries no information and gives (0.0, 1.0).
    """
    _check_z(z)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n={n}], got {successes!r}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, Codex).

    pass@k = 1 - C(n - c, k) / C(n, k), evaluated as a product to avoid huge binomials.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got {c!r}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k!r}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i)
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


# Student t 97.5% quantiles for 1..30 degrees of freedom (two-sided 95%).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """Student t 97.5% quantile: a table to 30 degrees of freedom, a Cornish-Fisher series above."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = Z_95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def paired_difference(
    a: Sequence[float], b: Sequence[float], *, z: float | None = None
) -> tuple[float, float, float]:
    """Mean of a_i - b_i with a 95% interval: (mean_diff, low, high).

    a and b score the same units (e.g. trained and base model on the same prompts), so the
    pairing removes the per-unit difficulty from the variance. The interval is
    mean +- q * sd(d) / sqrt(n) with the Bessel-corrected sd, where q is Student's t quantile
    with n - 1 degrees of freedom (the default: honest for the handful of held-out prompts
    evals often have) or the given normal quantile z. It assumes roughly normal differences;
    for 0/1 scores with few discordant pairs an exact McNemar test is the better tool. When
    every difference is equal the interval collapses to that value.
    """
    if z is not None:
        _check_z(z)
    if len(a) != len(b):
        raise ValueError(
            f"a and b must have equal length (paired scores), got {len(a)} and {len(b)}"
        )
    n = len(a)
    if n < 2:
        raise ValueError(f"paired_difference needs at least 2 pairs, got {n}")
    diffs = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    if not all(math.isfinite(d) for d in diffs):
        raise ValueError("a and b must hold finite scores")
    mean = math.fsum(diffs) / n
    var = math.fsum((d - mean) ** 2 for d in diffs) / (n - 1)
    q = t_quantile_975(n - 1) if z is None else z
    half = q * math.sqrt(var / n)
    return (mean, mean - half, mean + half)


def zero_variance_share(
    rewards_table: Sequence[Sequence[float | None]], *, atol: float = 1e-8
) -> float:
    """Share of groups whose rewards are all equal (within atol): groups with no GRPO signal.

    rewards_table: one list of rewards per prompt (its group of completions). None and NaN mean
    "no reward" and are ignored; a group with fewer than two rewards left counts as zero-variance.
    """
    if len(rewards_table) == 0:
        raise ValueError("rewards_table is empty: need at least one group of rewards")
    flat = 0
    for group in rewards_table:
        values = [float(r) for r in group if r is not None and not math.isnan(r)]
        if len(values) < 2 or max(values) - min(values) <= atol:
            flat += 1
    return flat / len(rewards_table)
