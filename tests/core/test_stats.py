"""Wilson and per-prompt cluster intervals, Student t, pass@k, paired differences, zero-variance
share."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from grpokit.core.stats import (
    cluster_mean_stderr,
    cluster_pass_interval,
    cluster_pass_summary,
    cohen_kappa,
    design_effect,
    paired_difference,
    pass_at_k,
    pearson,
    ranks,
    spearman,
    spearman_interval,
    student_t_quantile,
    student_t_sf,
    t_quantile_975,
    wilson_interval,
    zero_variance_share,
)


def test_wilson_known_values() -> None:
    # 0/32: centre = (z^2 / 2n) / (1 + z^2 / n), half the same, so (0, (z^2/n) / (1 + z^2/n))
    # = 0.1200456 / 1.1200456 = 0.1071792.
    low, high = wilson_interval(0, 32)
    assert low == 0.0
    assert high == pytest.approx(0.1071792, abs=1e-7)
    # 17/32: p = 0.53125, z^2/n = 0.1200456, centre = (0.53125 + 0.0600228) / 1.1200456
    # = 0.5279013; half = 1.959964 / 1.1200456 * sqrt(0.53125 * 0.46875 / 32 + 0.1200456 / 128)
    # = 1.7499 * 0.0933804 = 0.1634062 -> (0.3644951, 0.6913075).
    low, high = wilson_interval(17, 32)
    assert low == pytest.approx(0.364495, abs=2e-6)
    assert high == pytest.approx(0.691306, abs=2e-6)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(32, 32)
    assert high == 1.0 and low == pytest.approx(1 - 0.1071792, abs=1e-7)


def test_pass_at_k() -> None:
    # n 10, c 3, k 1: the plain success rate 0.3.
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # n 10, c 3, k 2: 1 - C(7,2)/C(10,2) = 1 - 21/45 = 0.5333333.
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - 21 / 45)
    # n 5, c 1, k 5: any 5 of 5 include the correct one -> 1; c 0 -> 0.
    assert pass_at_k(5, 1, 5) == 1.0
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(200, 13, 10) == pytest.approx(1 - math.comb(187, 10) / math.comb(200, 10))


def test_paired_difference() -> None:
    # d = (1, 0, 1, 0): mean 0.5, Bessel variance (4 * 0.25) / 3 = 1/3, se = sqrt(1/12) = 0.2886751,
    # half = 1.959964 * 0.2886751 = 0.5657929.
    mean, low, high = paired_difference([1, 1, 1, 0], [0, 1, 0, 0], z=1.959963984540054)
    assert mean == pytest.approx(0.5)
    assert low == pytest.approx(0.5 - 0.5657929, abs=1e-6)
    assert high == pytest.approx(0.5 + 0.5657929, abs=1e-6)
    # Default: Student t with 3 degrees of freedom, 3.182446 * 0.2886751 = 0.9186931.
    mean, low, high = paired_difference([1, 1, 1, 0], [0, 1, 0, 0])
    assert (low, high) == pytest.approx((0.5 - 0.9186931, 0.5 + 0.9186931), abs=1e-6)
    assert paired_difference([2.0, 3.0], [1.0, 2.0]) == (1.0, 1.0, 1.0)


def test_zero_variance_share() -> None:
    # Groups: all 0 (flat), (1, 0) (signal), (None, 1, None) one value (flat), (0.5, NaN, 0.5)
    # (flat) -> 3 / 4.
    table: list[list[float | None]] = [
        [0.0, 0.0, 0.0],
        [1.0, 0.0],
        [None, 1.0, None],
        [0.5, math.nan, 0.5],
    ]
    assert zero_variance_share(table) == 0.75
    assert zero_variance_share([[1.0, 0.0]]) == 0.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)
    with pytest.raises(ValueError, match="n must be >= 0"):
        wilson_interval(0, -1)
    with pytest.raises(ValueError, match="k must be"):
        pass_at_k(5, 2, 6)
    with pytest.raises(ValueError, match="c must be"):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError, match="equal length"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_difference([1.0], [1.0])
    with pytest.raises(ValueError, match="empty"):
        zero_variance_share([])


def test_t_quantiles() -> None:
    # Printed tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2), to their 3 decimals.
    assert t_quantile_975(3) == pytest.approx(3.182, abs=5e-4)
    assert t_quantile_975(40) == pytest.approx(2.021, abs=5e-4)
    assert t_quantile_975(1000) == pytest.approx(1.962, abs=5e-4)
    assert student_t_quantile(0.995, 10) == pytest.approx(3.169, abs=5e-4)
    assert student_t_quantile(0.025, 3) == pytest.approx(-3.182, abs=5e-4)
    # Closed forms: df 1 is Cauchy, t = tan(pi (p - 1/2)); df 2 has t = (2p - 1) sqrt(2 / (4p(1-p))).
    for p in (0.9, 0.975, 1 - 5e-5):
        assert student_t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
        q2 = (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))
        assert student_t_quantile(p, 2) == pytest.approx(q2, rel=1e-9)
    # Large df: the normal quantile.
    assert student_t_quantile(0.975, 10**6) == pytest.approx(1.959966, abs=1e-6)


def test_student_t_sf_closed_forms() -> None:
    # df 1: 1/2 - atan(t) / pi; df 2: (1 - t / sqrt(2 + t^2)) / 2; df 3:
    # 1/2 - (atan(t / sqrt 3) + sqrt(3) t / (3 + t^2)) / pi.
    for t in (0.0, 0.5, 2.0, 7.0):
        assert student_t_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, rel=1e-12)
        assert student_t_sf(t, 2) == pytest.approx((1 - t / math.sqrt(2 + t * t)) / 2, rel=1e-12)
        d3 = 0.5 - (math.atan(t / math.sqrt(3)) + math.sqrt(3) * t / (3 + t * t)) / math.pi
        assert student_t_sf(t, 3) == pytest.approx(d3, rel=1e-9, abs=1e-15)
        assert student_t_sf(-t, 5) == pytest.approx(1 - student_t_sf(t, 5))
    assert student_t_sf(math.inf, 4) == 0.0
    # Many degrees of freedom: close to the normal tail 1 - Phi(3) = 0.0013499.
    assert student_t_sf(3.0, 1999) == pytest.approx(0.0013499, rel=0.02)
    with pytest.raises(ValueError, match="df"):
        student_t_sf(1.0, 0)


# ---- per-prompt (cluster) intervals --------------------------------------------------------------


def test_design_effect_hand_computed() -> None:
    # 4 prompts x 2 samples: passes 2, 2, 0, 0 -> p = 0.5, residuals (s - p m) = 1, 1, -1, -1;
    # clustered 4/3 * 4 / 64 = 1/12, binomial 0.25 / 7 -> deff = 7/3 (every prompt's samples
    # agree: close to the maximum 2 for K = 2, the excess is the k / (k - 1) correction).
    assert design_effect([2, 2, 0, 0], [2, 2, 2, 2]) == pytest.approx(7 / 3)
    # passes 1, 1, 1, 1: every prompt at the mean, no between-prompt variance -> floor 1.
    assert design_effect([1, 1, 1, 1], [2, 2, 2, 2]) == 1.0
    # one sample per prompt, or one prompt: 1; all failures: the worst case N / k.
    assert design_effect([1, 0, 1], [1, 1, 1]) == 1.0
    assert design_effect([3], [8]) == 1.0
    assert design_effect([0, 0, 0, 0], [2, 2, 2, 4]) == pytest.approx(10 / 4)
    with pytest.raises(ValueError, match="sizes >= 1"):
        design_effect([0], [0])


def test_cluster_mean_stderr_hand_computed() -> None:
    # 3 prompts x 2 samples, prompt sums 1.0, 0.4, 1.6 -> mean 0.5; residuals 0, -0.6, 0.6:
    # se^2 = 3/2 * 0.72 / 36 = 0.03.
    assert cluster_mean_stderr([[0.5, 0.5], [0.0, 0.4], [1.0, 0.6]]) == pytest.approx(0.03**0.5)
    # One sample per prompt: the textbook sd / sqrt(k); NaN (not applicable) samples are skipped.
    values = [0.1, 0.7, 0.4, 0.9]
    expected = statistics.stdev(values) / 2
    assert cluster_mean_stderr([[v] for v in values]) == pytest.approx(expected)
    assert cluster_mean_stderr([[v, math.nan] for v in values]) == pytest.approx(expected)
    # Samples that agree within each prompt carry no more information than one per prompt.
    assert cluster_mean_stderr([[v] * 4 for v in values]) == pytest.approx(expected)
    assert cluster_mean_stderr([[1.0, 0.0, 1.0]]) is None
    assert cluster_mean_stderr([[1.0], [math.nan]]) is None


def test_cluster_interval_reduces_to_wilson_with_one_sample_per_prompt() -> None:
    passes = [[True]] * 17 + [[False]] * 15
    assert cluster_pass_summary(passes) == pytest.approx((17, 32, *wilson_interval(17, 32)))
    assert cluster_pass_interval([[False]] * 32) == pytest.approx(wilson_interval(0, 32))
    assert cluster_pass_summary([]) == (0, 0, 0.0, 1.0)
    assert cluster_pass_summary([[], [True, False]])[:2] == (1, 2)


def test_cluster_interval_hand_computed() -> None:
    # 4 prompts x 2: deff 7/3 (above), n_eff = 8 / (7/3) = 24/7, q = t(0.975, 3) = 3.182446:
    # Wilson(p 0.5, n 24/7, q): z2n = q^2 * 7/24 = 2.953990, centre 0.5,
    # half = q / (1 + z2n) * sqrt(0.25 / n + z2n / (4 n)) = 0.804870 * sqrt(0.072917 + 0.215395)
    # = 0.432172.
    passed, n, lo, hi = cluster_pass_summary([[True, True]] * 2 + [[False, False]] * 2)
    assert (passed, n) == (4, 8)
    assert (lo, hi) == pytest.approx((0.5 - 0.432172, 0.5 + 0.432172), abs=2e-6)
    # All failures on 32 prompts x 2: counted as 32 prompts (worst case), t with 31 df.
    lo, hi = cluster_pass_interval([[False, False]] * 32)
    q = t_quantile_975(31)
    assert lo == 0.0 and hi == pytest.approx(q * q / 32 / (1 + q * q / 32))
    assert hi > wilson_interval(0, 64)[1]


def _beta_binomial(
    rng: np.random.Generator, reps: int, prompts: int, k: int, mean: float, rho: float
) -> tuple[np.ndarray, np.ndarray]:
    """reps datasets of prompts x k samples: prompt success p_i ~ Beta with the given mean and
    intra-prompt correlation rho = 1 / (a + b + 1). Returns (p [reps, prompts], passes [reps,
    prompts, k])."""
    ab = 1 / rho - 1
    p = rng.beta(mean * ab, (1 - mean) * ab, size=(reps, prompts))
    return p, rng.random((reps, prompts, k)) < p[..., None]


@pytest.mark.parametrize(
    ("prompts", "k", "mean", "rho", "wilson_below"),
    [(32, 8, 0.4, 0.3, 0.8), (32, 2, 0.5, 0.5, 0.9), (10, 4, 0.3, 0.3, 0.88)],
)
def test_cluster_interval_covers_at_95_percent_where_wilson_does_not(
    prompts: int, k: int, mean: float, rho: float, wilson_below: float
) -> None:
    # 2000 simulated evals with known intra-prompt correlation: coverage of the true mean.
    # Standard error of a coverage near 0.95 over 2000 datasets: 0.005.
    reps = 2000
    _, x = _beta_binomial(np.random.default_rng(7), reps, prompts, k, mean, rho)
    cluster = wilson = 0
    for data in x:
        lo, hi = cluster_pass_interval(data.tolist())
        cluster += lo <= mean <= hi
        lo, hi = wilson_interval(int(data.sum()), prompts * k)
        wilson += lo <= mean <= hi
    assert 0.93 <= cluster / reps <= 0.97
    assert wilson / reps < wilson_below


def test_paired_difference_over_prompt_means_covers_with_correlated_samples() -> None:
    # Two models on the same prompts: prompt difficulty is shared (a logit offset per prompt),
    # the trained model adds 0.8 on the logit scale. The t interval over per-prompt means is the
    # cluster interval of the difference; the true difference is E[p_b - p_a] over prompts.
    rng = np.random.default_rng(3)
    reps, prompts, k = 2000, 24, 4
    logit = rng.normal(-0.3, 1.5, size=(reps, prompts))
    pa, pb = 1 / (1 + np.exp(-logit)), 1 / (1 + np.exp(-(logit + 0.8)))
    big = rng.normal(-0.3, 1.5, size=2_000_000)
    truth = float(np.mean(1 / (1 + np.exp(-(big + 0.8))) - 1 / (1 + np.exp(-big))))
    a = (rng.random((reps, prompts, k)) < pa[..., None]).mean(axis=2)
    b = (rng.random((reps, prompts, k)) < pb[..., None]).mean(axis=2)
    covered = sum(
        lo <= truth <= hi for _, lo, hi in (paired_difference(b[r], a[r]) for r in range(reps))
    )
    assert 0.93 <= covered / reps <= 0.97


def test_ranks_and_correlations_hand_computed() -> None:
    assert ranks([10.0, 30.0, 20.0, 20.0]) == [1.0, 4.0, 2.5, 2.5]
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # x = 1, 2, 3; y = 1, 3, 2: deviations (-1, 0, 1) and (-1, 1, 0): 1 / sqrt(2 * 2) = 0.5.
    assert pearson([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    xs, ys = [0.3, 1.7, 2.2, 5.0, 4.1], [1.0, 0.2, 2.5, 3.9, 3.0]
    assert pearson(xs, ys) == pytest.approx(float(np.corrcoef(xs, ys)[0, 1]), abs=1e-12)
    assert pearson(xs, ys) == pytest.approx(statistics.correlation(xs, ys), abs=1e-12)


def test_correlation_is_nan_where_undefined() -> None:
    # One rule for every caller: a constant series has no variance to correlate.
    assert math.isnan(pearson([1, 2, 3], [5, 5, 5]))
    assert math.isnan(pearson([2, 2], [1, 3]))
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))
    assert math.isnan(pearson([1.0], [2.0]))
    assert math.isnan(pearson([], []))
    with pytest.raises(ValueError, match="different lengths"):
        pearson([1, 2], [1, 2, 3])


def test_cohen_kappa_hand_computed() -> None:
    # 50 items: both yes 20, a yes / b no 5, a no / b yes 10, both no 15.
    # p_o = 0.7; a says yes 0.5, b 0.6; p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5; kappa = 0.4.
    a = [True] * 25 + [False] * 25
    b = [True] * 20 + [False] * 5 + [True] * 10 + [False] * 15
    kappa, lo, hi = cohen_kappa(a, b)
    assert kappa == pytest.approx(0.4)
    # Fleiss-Cohen-Everitt by hand: cells p11 .4, p10 .1, p01 .2, p00 .3; rows (a) .5/.5,
    # columns (b) .6/.4. agree = .4 (1 - 1.1 * .6)^2 + .3 (1 - .9 * .6)^2 = .04624 + .06348;
    # disagree = (1 - kappa)^2 (p10 (p.1 + p0.)^2 + p01 (p.0 + p1.)^2)
    #          = .36 (.1 (.6 + .5)^2 + .2 (.4 + .5)^2) = .36 * .283; chance = (.4 - .5 * .6)^2.
    var = (0.04624 + 0.06348 + 0.36 * 0.283 - 0.01) / (50 * 0.25)
    half = 1.959963984540054 * math.sqrt(var)
    assert (lo, hi) == pytest.approx((0.4 - half, 0.4 + half))
    assert cohen_kappa(a, a)[0] == pytest.approx(1.0)
    assert cohen_kappa(a, [not x for x in a])[0] == pytest.approx(-1.0)


def test_cohen_kappa_undefined_and_bad_input() -> None:
    assert all(math.isnan(x) for x in cohen_kappa([], []))
    # Both raters say yes to everything: agreement is perfect but says nothing beyond chance.
    assert all(math.isnan(x) for x in cohen_kappa([True] * 5, [True] * 5))
    with pytest.raises(ValueError, match="different numbers"):
        cohen_kappa([True], [True, False])


def test_cohen_kappa_interval_matches_its_sampling_spread_and_covers() -> None:
    """Draw 300 items from a fixed 2x2 table many times: the analytic standard error is the
    spread of kappa over the draws, and the 95% interval holds the table's kappa ~95% of the
    time."""
    rng = np.random.default_rng(0)
    cells = [0.35, 0.1, 0.15, 0.4]  # p11, p10, p01, p00
    pa, pb = cells[0] + cells[1], cells[0] + cells[2]
    p_e = pa * pb + (1 - pa) * (1 - pb)
    true_kappa = (cells[0] + cells[3] - p_e) / (1 - p_e)
    n, reps = 300, 1500
    kappas, widths, covered = [], [], 0
    for counts in rng.multinomial(n, cells, size=reps):
        a = [True] * int(counts[0] + counts[1]) + [False] * int(counts[2] + counts[3])
        b = ([True] * int(counts[0]) + [False] * int(counts[1]) + [True] * int(counts[2])
             + [False] * int(counts[3]))  # fmt: skip
        kappa, lo, hi = cohen_kappa(a, b)
        kappas.append(kappa)
        widths.append((hi - lo) / (2 * 1.959963984540054))
        covered += lo <= true_kappa <= hi
    assert statistics.stdev(kappas) == pytest.approx(statistics.mean(widths), rel=0.08)
    assert 0.93 <= covered / reps <= 0.97


def test_spearman_interval_hand_computed_and_undefined() -> None:
    rho, lo, hi = spearman_interval([1, 2, 3, 4, 5], [1, 2, 3, 5, 4])
    assert rho == pytest.approx(0.9)
    # z = atanh(0.9) = 1.47222, se = sqrt((1 + 0.405) / 2) = 0.83815.
    assert lo == pytest.approx(math.tanh(1.472219 - 1.959964 * 0.838153), abs=1e-5)
    assert hi == pytest.approx(math.tanh(1.472219 + 1.959964 * 0.838153), abs=1e-5)
    assert lo == pytest.approx(-0.1692, abs=1e-3)
    rho, lo, hi = spearman_interval([1, 2, 3], [1, 3, 2])
    assert rho == pytest.approx(0.5) and math.isnan(lo) and math.isnan(hi)
    assert all(math.isnan(x) for x in spearman_interval([1, 2, 3, 4], [2, 2, 2, 2]))


def test_spearman_interval_covers_the_population_rank_correlation() -> None:
    """Bivariate normal with Pearson r has Spearman 6 / pi * asin(r / 2)."""
    rng = np.random.default_rng(1)
    r, n, reps = 0.6, 40, 1500
    population = 6 / math.pi * math.asin(r / 2)
    cov = [[1.0, r], [r, 1.0]]
    covered = 0
    for _ in range(reps):
        xy = rng.multivariate_normal([0.0, 0.0], cov, size=n)
        _, lo, hi = spearman_interval(xy[:, 0].tolist(), xy[:, 1].tolist())
        covered += lo <= population <= hi
    assert 0.93 <= covered / reps <= 0.975
