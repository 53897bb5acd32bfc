"""Small statistics on plain Python floats, for preflight checks, evaluation tables, audits and
monitors."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist

__all__ = [
    "Z_95",
    "cluster_mean_stderr",
    "cluster_pass_interval",
    "cluster_pass_summary",
    "cohen_kappa",
    "design_effect",
    "length_adjusted_difference",
    "pass_at_k",
    "paired_difference",
    "pearson",
    "ranks",
    "spearman",
    "spearman_interval",
    "student_t_quantile",
    "student_t_sf",
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
    n = 0 carries no information and gives (0.0, 1.0). It treats the n trials as independent:
    for several samples of each prompt use :func:`cluster_pass_interval`.
    """
    _check_z(z)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n={n}], got {successes!r}")
    if n == 0:
        return (0.0, 1.0)
    return _wilson(successes / n, n, z)


def _wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson bounds for an observed proportion p over n trials; n may be an effective size."""
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


def _cluster_variance(sums: Sequence[float], sizes: Sequence[int]) -> float:
    """Cluster-robust variance of the pooled mean m = S / N over k >= 2 prompts (S, N the sums of
    each prompt's score sums and sample counts): k / (k - 1) * sum_i (S_i - m N_i)^2 / N^2."""
    k, total = len(sizes), sum(sizes)
    m = math.fsum(sums) / total
    residuals = math.fsum((s - m * n) ** 2 for s, n in zip(sums, sizes, strict=True))
    return k / (k - 1) * residuals / total**2


def design_effect(successes: Sequence[int], sizes: Sequence[int]) -> float:
    """How much the samples' correlation within a prompt widens a pooled pass rate's variance.

    successes[i] of the sizes[i] samples of prompt i passed (one entry per prompt, sizes >= 1).
    The pooled rate p = S / N (S, N the sums) is a ratio estimator over k prompts; its
    cluster-robust variance k / (k - 1) * sum_i (successes_i - p sizes_i)^2 / N^2, over the
    binomial p (1 - p) / (N - 1), is the design effect (Kish's deff, about 1 + (K - 1) rho for
    K samples per prompt with intra-prompt correlation rho). It is kept at 1 or more (a value
    below 1 is sampling noise: samples of one prompt are not anti-correlated).

    Special cases: one sample per prompt, or a single prompt (its samples are then the
    population), give 1. When every sample agrees (p = 0 or 1) the correlation cannot be
    measured and the worst case is taken: N / k, each prompt counting once.
    """
    if len(successes) != len(sizes):
        raise ValueError(f"successes and sizes differ in length: {len(successes)}, {len(sizes)}")
    if any(m < 1 for m in sizes):
        raise ValueError("every prompt needs at least one sample (sizes >= 1)")
    if any(not 0 <= s <= m for s, m in zip(successes, sizes, strict=True)):
        raise ValueError("successes must lie in [0, size] for every prompt")
    k, total = len(sizes), sum(sizes)
    if k < 2 or total == k:
        return 1.0
    p = sum(successes) / total
    if p in (0.0, 1.0):
        return total / k
    clustered = _cluster_variance(successes, sizes)
    binomial = p * (1.0 - p) / (total - 1)
    return max(1.0, clustered / binomial)


def cluster_pass_summary(
    passes_per_prompt: Sequence[Sequence[bool]], *, confidence: float = 0.95
) -> tuple[int, int, float, float]:
    """Pooled pass count with a per-prompt (cluster) interval: (passed, n, low, high).

    passes_per_prompt: one list per prompt, one bool per sample (prompts without samples are
    skipped). Samples of one prompt are correlated (an easy prompt passes in most of them), so
    the n samples carry less information than n independent trials. The interval is Wilson's on
    the effective sample size n / deff (:func:`design_effect`) with Student's t quantile on
    k - 1 degrees of freedom in place of the normal one, k the number of prompts, for the
    variance was estimated from k prompts (Korn and Graubard's adjustment for survey data). With
    one sample per prompt it is exactly :func:`wilson_interval`. Deterministic: the same table
    every time, unlike a bootstrap. No samples give (0, 0, 0.0, 1.0).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    groups = [g for g in passes_per_prompt if len(g) > 0]
    successes = [sum(bool(x) for x in g) for g in groups]
    sizes = [len(g) for g in groups]
    passed, n = sum(successes), sum(sizes)
    if n == 0:
        return (0, 0, 0.0, 1.0)
    tail = (1.0 + confidence) / 2.0
    k = len(groups)
    q = student_t_quantile(tail, k - 1) if 1 < k < n else NormalDist().inv_cdf(tail)
    lo, hi = _wilson(passed / n, n / design_effect(successes, sizes), q)
    return (passed, n, lo, hi)


def cluster_pass_interval(
    passes_per_prompt: Sequence[Sequence[bool]], *, confidence: float = 0.95
) -> tuple[float, float]:
    """The (low, high) of :func:`cluster_pass_summary`: a pass rate's interval over prompts."""
    _, _, lo, hi = cluster_pass_summary(passes_per_prompt, confidence=confidence)
    return (lo, hi)


def cluster_mean_stderr(values_per_prompt: Sequence[Sequence[float]]) -> float | None:
    """Standard error of the pooled mean of scores grouped by prompt, prompts as the units.

    values_per_prompt: one list per prompt, one score per sample (NaN and empty lists skipped).
    The pooled mean m = S / N is a ratio estimator over k prompts; its cluster-robust variance is
    k / (k - 1) * sum_i (S_i - m N_i)^2 / N^2 (the same estimator as :func:`design_effect`): the
    samples of one prompt are correlated, so they are not counted as independent. With one
    sample per prompt it is the usual sd / sqrt(k). None with fewer than two prompts (no spread
    between prompts to measure).

    >>> round(cluster_mean_stderr([[1.0, 1.0], [0.0, 0.0]]), 3)
    0.5
    >>> round(cluster_mean_stderr([[1.0], [0.0], [1.0], [0.0]]), 3)
    0.289
    """
    groups = [[v for v in g if not math.isnan(v)] for g in values_per_prompt]
    groups = [g for g in groups if g]
    k = len(groups)
    if k < 2:
        return None
    return math.sqrt(_cluster_variance([math.fsum(g) for g in groups], [len(g) for g in groups]))


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


# Above this the t quantile is the normal one corrected by a Cornish-Fisher series (relative
# error < 1e-6 at 97.5%, and no bisection over a series of df / 2 terms).
_SERIES_MAX_DF = 2000


def student_t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with df (an integer >= 1) degrees of freedom.

    Exact: the finite series in theta = atan(t / sqrt(df)) of Abramowitz and Stegun 26.7.3-4
    for A = P(|T| < |t|), then (1 - A) / 2: df / 2 terms, relative error below 1e-5 down to
    tails of 1e-11.
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if math.isnan(t):
        raise ValueError("t is NaN")
    if t < 0:
        return 1.0 - student_t_sf(-t, df)
    if math.isinf(t):
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2 / pi) (theta + sin cos (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ...))
        term, acc = 1.0, 1.0 if df > 1 else 0.0
        for j in range(2, df - 1, 2):
            term *= j / (j + 1) * c2
            acc += term
        a = 2.0 / math.pi * (theta + math.sin(theta) * math.cos(theta) * acc)
    else:  # even: sin (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...)
        term, acc = 1.0, 1.0
        for j in range(1, df - 2, 2):
            term *= j / (j + 1) * c2
            acc += term
        a = math.sin(theta) * acc
    return max(0.0, (1.0 - a) / 2.0)


@lru_cache(maxsize=1024)
def student_t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p for Student's t with df (an integer >= 1) degrees of freedom.

    Bisection on :func:`student_t_sf` to a relative 1e-12; above 2000 degrees of freedom a
    Cornish-Fisher series around the normal quantile.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    if df > _SERIES_MAX_DF:
        z = NormalDist().inv_cdf(p)
        return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    tail = 1.0 - p
    lo, hi = 0.0, 1.0
    while student_t_sf(hi, df) > tail:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2.0
        if student_t_sf(mid, df) > tail:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def t_quantile_975(df: int) -> float:
    """Student t 97.5% quantile (two-sided 95%) with df degrees of freedom."""
    return student_t_quantile(0.975, df)


def paired_difference(
    a: Sequence[float], b: Sequence[float], *, z: float | None = None
) -> tuple[float, float, float]:
    """Mean of a_i - b_i with a 95% interval: (mean_diff, low, high).

    a and b score the same units (e.g. trained and base model on the same prompts), so the
    pairing removes the per-unit difficulty from the variance. Given per-prompt means of K
    samples each, it is the per-prompt (cluster) interval of the difference of two pass rates or
    mean rewards: the prompts are the independent units, whatever the samples' correlation
    within a prompt (with equal K it equals the ratio estimator's cluster-robust interval).
    The interval is mean +- q * sd(d) / sqrt(n) with the Bessel-corrected sd, q Student's t quantile
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


MIN_BOOTSTRAP_CLUSTERS = 5
"""Fewest prompts :func:`length_adjusted_difference` resamples: over 2 prompts a percentile
bootstrap has 3 distinct resamples and an interval far narrower than the t interval's."""

# Per cluster: n, sum g, sum L, sum y, sum gL, sum gy, sum LL, sum Ly (g is 0/1, so sum gg = sum g).
_Moments = tuple[float, float, float, float, float, float, float, float]


def _moments(rows: Sequence[tuple[float, float, float]]) -> _Moments:
    n = float(len(rows))
    sg = math.fsum(g for g, _, _ in rows)
    sl = math.fsum(x for _, x, _ in rows)
    sy = math.fsum(y for _, _, y in rows)
    sgl = math.fsum(g * x for g, x, _ in rows)
    sgy = math.fsum(g * y for g, _, y in rows)
    sll = math.fsum(x * x for _, x, _ in rows)
    sly = math.fsum(x * y for _, x, y in rows)
    return (n, sg, sl, sy, sgl, sgy, sll, sly)


def _adjusted_from_moments(m: Sequence[float]) -> float | None:
    """The model coefficient d of y = a + d g + s L by least squares, from summed moments.

    By Frisch-Waugh, d regresses y on g after both are residualised on (1, L):
    d = (C_gy - C_gL C_Ly / C_LL) / (C_gg - C_gL^2 / C_LL), with C the centred cross sums.
    Equal lengths (C_LL = 0) leave the plain difference of means, C_gy / C_gg. None when g is
    constant or wholly explained by length (the two models' lengths do not overlap linearly).
    """
    n, sg, sl, sy, sgl, sgy, sll, sly = m
    if n < 2:
        return None
    cgg = sg - sg * sg / n
    cgl = sgl - sg * sl / n
    cgy = sgy - sg * sy / n
    cll = sll - sl * sl / n
    cly = sly - sl * sy / n
    # Relative to the scale of the terms, so that rounding in a constant length is not a slope.
    if cll <= 1e-12 * max(sll, 1.0):
        return cgy / cgg if cgg > 1e-12 * max(n, 1.0) else None
    den = cgg - cgl * cgl / cll
    if den <= 1e-12 * max(cgg, 1e-300):
        return None
    return (cgy - cgl * cly / cll) / den


def length_adjusted_difference(
    rows: Sequence[tuple[int, bool, float, float]], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float] | None:
    """A model's difference from the base at equal length: (estimate, low, high), 95%.

    rows: one per sample, ``(cluster, is_other, length, value)``: its prompt, whether the
    compared model (True) or the base (False) wrote it, its length in tokens and its score.
    The estimate is d in the least-squares fit value = a + d * is_other + s * length over all
    samples of both models: the score difference between the models among answers of the same
    length, the control a judge's liking for longer answers needs (a trained model that only
    writes more scores higher on the raw difference, not on this one). The interval is the
    2.5% and 97.5% points of d over ``resamples`` resamplings of the clusters with replacement
    (each with all its samples), so the prompts stay the independent units as in
    :func:`paired_difference`. None when the fit has no answer (one model only, or is_other a
    linear function of length) or the samples come from fewer than
    :data:`MIN_BOOTSTRAP_CLUSTERS` prompts, too few to resample.

    The fit is linear in length: a judge whose liking saturates is only approximately
    controlled, and with lengths that barely overlap between the models the estimate
    extrapolates (its interval then widens).
    """
    per: dict[int, list[tuple[float, float, float]]] = {}
    for cluster, other, length, value in rows:
        per.setdefault(cluster, []).append((1.0 if other else 0.0, float(length), float(value)))
    if not per:
        return None
    moments = {k: _moments(v) for k, v in per.items()}
    estimate = _adjusted_from_moments([math.fsum(c) for c in zip(*moments.values(), strict=True)])
    if estimate is None:
        return None
    keys = sorted(moments)
    if len(keys) < MIN_BOOTSTRAP_CLUSTERS:
        return None
    rng = random.Random(seed)
    fits: list[float] = []
    for _ in range(resamples):
        picked = [moments[k] for k in rng.choices(keys, k=len(keys))]
        d = _adjusted_from_moments([math.fsum(c) for c in zip(*picked, strict=True)])
        if d is not None:  # a resample may hold one model only; it has no difference to give
            fits.append(d)
    if not fits:  # every resample lacked a model: no interval to give, and no zero-width one
        return None
    fits.sort()
    return (estimate, fits[int(0.025 * (len(fits) - 1))], fits[int(0.975 * (len(fits) - 1))])


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


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank (as Spearman's correlation needs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation of two series of equal length.

    NaN when it is undefined: fewer than two points, or a constant series (no variance to
    correlate). A caller that needs a number decides what a constant series means for it (a
    monitor reads it as "no trend", an audit prints it as missing).

    Raises:
        ValueError: the series differ in length.
    """
    if len(xs) != len(ys):
        raise ValueError(f"series of different lengths: {len(xs)} and {len(ys)}")
    n = len(xs)
    if n < 2:
        return math.nan
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    syy = math.fsum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return math.nan
    return sxy / math.sqrt(sxx * syy)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman rank correlation: :func:`pearson` on average ranks, so NaN where that is (fewer
    than two points, or a series whose values are all equal)."""
    return pearson(ranks(xs), ranks(ys))


def cohen_kappa(
    a: Sequence[bool], b: Sequence[bool], *, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Cohen's kappa of two raters' yes/no grades of the same items, with an analytic interval:
    (kappa, low, high).

    a, b: one grade each per item (equal length). kappa = (p_o - p_e) / (1 - p_e), p_o the
    share of items they agree on and p_e = sum_c p_a(c) p_b(c) the share expected by chance
    from their marginal rates. The interval is kappa +- q * se, q the normal quantile, with the
    large-sample variance of Fleiss, Cohen and Everitt (1969), which holds away from kappa = 0
    too: with p_ij the share graded i by a and j by b and p_i., p_.j the margins,
    var = [sum_i p_ii (1 - (p_i. + p_.i)(1 - kappa))^2
           + (1 - kappa)^2 sum_{i != j} p_ij (p_.i + p_j.)^2 - (kappa - p_e (1 - kappa))^2]
          / (n (1 - p_e)^2),
    clipped to [-1, 1]. NaN (all three) when kappa is undefined: no items, or both raters
    giving one and the same grade to everything (p_e = 1).

    >>> round(cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0])[0], 3)
    0.5
    """
    if len(a) != len(b):
        raise ValueError(f"a and b grade different numbers of items: {len(a)} and {len(b)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    n = len(a)
    nan = (math.nan, math.nan, math.nan)
    if n == 0:
        return nan
    cell = [[0.0, 0.0], [0.0, 0.0]]  # cell[i][j]: share graded i by a and j by b
    for x, y in zip(a, b, strict=True):
        cell[int(bool(x))][int(bool(y))] += 1.0 / n
    row = [cell[i][0] + cell[i][1] for i in (0, 1)]
    col = [cell[0][j] + cell[1][j] for j in (0, 1)]
    p_o = cell[0][0] + cell[1][1]
    p_e = row[0] * col[0] + row[1] * col[1]
    if p_e >= 1.0 - 1e-12:
        return nan
    kappa = (p_o - p_e) / (1.0 - p_e)
    agree = math.fsum(cell[i][i] * (1.0 - (row[i] + col[i]) * (1.0 - kappa)) ** 2 for i in (0, 1))
    disagree = (1.0 - kappa) ** 2 * math.fsum(
        cell[i][j] * (col[i] + row[j]) ** 2 for i in (0, 1) for j in (0, 1) if i != j
    )
    var = (agree + disagree - (kappa - p_e * (1.0 - kappa)) ** 2) / (n * (1.0 - p_e) ** 2)
    half = NormalDist().inv_cdf((1.0 + confidence) / 2.0) * math.sqrt(max(var, 0.0))
    return (kappa, max(-1.0, kappa - half), min(1.0, kappa + half))


def spearman_interval(
    xs: Sequence[float], ys: Sequence[float], *, confidence: float = 0.95
) -> tuple[float, float, float]:
    """Spearman's rank correlation with an interval from Fisher's z: (rho, low, high).

    z = atanh(rho) is close to normal with standard error sqrt((1 + rho^2 / 2) / (n - 3))
    (Bonett and Wright 2000, for rank correlations; Pearson's 1 / sqrt(n - 3) is too narrow
    for ranks), and the interval is tanh(z +- q * se), q the normal quantile. rho is NaN where
    :func:`spearman` is; the interval is NaN there and with fewer than 4 pairs.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    rho = spearman(xs, ys)
    n = len(xs)
    if math.isnan(rho) or n < 4:
        return (rho, math.nan, math.nan)
    # A perfect rank agreement has z = inf; just inside +-1 its interval is the point itself.
    z = math.atanh(max(-1.0 + 1e-15, min(1.0 - 1e-15, rho)))
    se = math.sqrt((1.0 + rho * rho / 2.0) / (n - 3))
    q = NormalDist().inv_cdf((1.0 + confidence) / 2.0)
    return (rho, math.tanh(z - q * se), math.tanh(z + q * se))
