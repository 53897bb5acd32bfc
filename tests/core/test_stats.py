"""Wilson interval, pass@k, paired differences, zero-variance share."""

from __future__ import annotations

import math

import pytest

from grpokit.core.stats import (
    paired_difference,
    pass_at_k,
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
    # Default: Student t with 3 degrees of freedom, 3.182 * 0.2886751 = 0.9185642.
    mean, low, high = paired_difference([1, 1, 1, 0], [0, 1, 0, 0])
    assert (low, high) == pytest.approx((0.5 - 0.9185642, 0.5 + 0.9185642), abs=1e-6)
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
    assert t_quantile_975(3) == pytest.approx(3.182)
    assert t_quantile_975(40) == pytest.approx(2.0211, abs=2e-4)
    assert t_quantile_975(1000) == pytest.approx(1.9623, abs=2e-4)
