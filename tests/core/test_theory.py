"""Success amplification (docs/math.md section 5): worked values, fixed points, edge cases."""

from __future__ import annotations

import math

import pytest

from grpokit.core.theory import fixed_point, fixed_points, h, h_prime, iterate


def test_worked_values_beta_1() -> None:
    # math.md: p_ref 0.2, eps 1e-6, beta 1: p_1 = 0.752818, p_2 = 0.717456, p_3 = 0.697359.
    # By hand: logit(0.2) = -ln 4 = -1.3862944; sqrt(0.2 * 0.8 + 1e-6) = 0.40000125;
    # -1.3862944 + 1 / 0.40000125 = 1.1137048, sigmoid = 0.752818.
    ps = iterate(0.2, beta=1.0, n_steps=3, eps=1e-6)
    assert ps[0] == 0.2
    assert ps[1:] == pytest.approx([0.752818, 0.717456, 0.697359], abs=5e-7)
    p_star = fixed_point(0.2, beta=1.0, eps=1e-6)
    assert p_star == pytest.approx(0.6812992, abs=5e-8)
    assert h(p_star, p_ref=0.2, beta=1.0) == pytest.approx(p_star, abs=1e-12)
    # h'(p*) = h(1-h)(2p-1) / (2 (p(1-p)+eps)^1.5) with h = p = 0.6812992:
    # 0.2171303 * 0.3625984 / (2 * 0.1011780) = 0.389.
    assert h_prime(p_star, p_ref=0.2, beta=1.0) == pytest.approx(0.389, abs=5e-4)


def test_worked_values_beta_0_1() -> None:
    # logit(p_1) = -1.3862944 + 1 / (0.1 * 0.40000125) = 23.613628; 1 - p_1 = e^-23.613628
    # = 5.56e-11. The limit is 1 in double precision.
    p1 = iterate(0.2, beta=0.1, n_steps=1)[1]
    assert 1.0 - p1 == pytest.approx(5.56e-11, rel=1e-3)
    assert fixed_point(0.2, beta=0.1) == 1.0


def test_without_std_normalisation() -> None:
    # h(p) = sigmoid(logit(0.2) + 1) = sigmoid(-0.3862944) = 0.4046096, whatever p.
    assert fixed_point(0.2, beta=1.0, std_normalized=False) == pytest.approx(0.40461, abs=5e-6)
    ps = iterate(0.2, beta=1.0, n_steps=3, std_normalized=False)
    assert ps[1] == ps[2] == ps[3] == pytest.approx(0.4046096, abs=1e-7)
    assert h_prime(0.3, p_ref=0.2, beta=1.0, std_normalized=False) == 0.0
    [only] = fixed_points(0.2, beta=1.0, std_normalized=False)
    assert only.p == pytest.approx(0.4046096, abs=1e-7) and only.stable


def test_cold_start_and_certain_success() -> None:
    assert fixed_point(0.0, beta=0.5) == 0.0
    assert iterate(0.0, beta=0.5, n_steps=2) == [0.0, 0.0, 0.0]
    assert h(0.7, p_ref=0.0, beta=0.5) == 0.0
    assert h(0.7, p_ref=1.0, beta=0.5) == 1.0
    assert fixed_points(0.0, beta=0.5) == []


def test_fixed_points_beta_1() -> None:
    # Three fixed points for p_ref 0.2, beta 1: the iteration's limit 0.6812992 (stable), an
    # unstable one near 0.9347, and one so close to 1 that it rounds to 1.0 (logit ~ 998.6:
    # logit(0.2) + 1 / sqrt(eps) = -1.386 + 1000).
    points = fixed_points(0.2, beta=1.0)
    assert [round(fp.p, 4) for fp in points] == [0.6813, 0.9347, 1.0]
    assert [fp.stable for fp in points] == [True, False, True]
    assert points[0].derivative == pytest.approx(0.389, abs=5e-4)
    assert points[2].logit == pytest.approx(1000.0 - math.log(4.0), abs=1e-6)
    lowest_stable = next(fp for fp in points if fp.stable)
    assert lowest_stable.p == pytest.approx(fixed_point(0.2, beta=1.0), abs=1e-10)
    for fp in points[:2]:
        assert h(fp.p, p_ref=0.2, beta=1.0) == pytest.approx(fp.p, abs=1e-12)


def test_amplification_lower_bound() -> None:
    # Every fixed point exceeds sigmoid(logit(p_ref) + 2 / (beta sqrt(1 + 4 eps))) > p_ref.
    for p_ref, beta in ((0.05, 2.0), (0.2, 1.0), (0.3, 10.0), (0.01, 0.5)):
        bound = 1.0 / (
            1.0 + math.exp(-(math.log(p_ref / (1 - p_ref)) + 2.0 / (beta * math.sqrt(1 + 4e-6))))
        )
        for fp in fixed_points(p_ref, beta=beta):
            assert fp.p >= bound > p_ref


def test_oscillating_iteration_raises() -> None:
    # p_ref 0.001, beta 5: the lowest fixed point (p ~ 0.0086) has h' ~ -1.06 < -1, so the
    # iteration settles into a 2-cycle instead of a limit.
    points = fixed_points(0.001, beta=5.0)
    assert not points[0].stable and points[0].derivative < -1.0
    with pytest.raises(RuntimeError, match="did not settle"):
        fixed_point(0.001, beta=5.0, max_iter=5000)


def test_h_prime_matches_finite_difference() -> None:
    for p in (0.1, 0.3, 0.5, 0.8):
        step = 1e-6
        numeric = (h(p + step, p_ref=0.2, beta=1.5) - h(p - step, p_ref=0.2, beta=1.5)) / (2 * step)
        assert h_prime(p, p_ref=0.2, beta=1.5) == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="p_ref must be a probability"):
        h(0.5, p_ref=1.2, beta=1.0)
    with pytest.raises(ValueError, match="p_ref must be a probability"):
        fixed_point(-0.1, beta=1.0)
    with pytest.raises(ValueError, match="beta must be > 0"):
        iterate(0.2, beta=0.0, n_steps=2)
    with pytest.raises(ValueError, match="p must be a probability"):
        h_prime(1.5, p_ref=0.2, beta=1.0)
    with pytest.raises(ValueError, match="n_steps"):
        iterate(0.2, beta=1.0, n_steps=-1)
    with pytest.raises(ValueError, match="eps > 0"):
        fixed_points(0.2, beta=1.0, eps=0.0)
