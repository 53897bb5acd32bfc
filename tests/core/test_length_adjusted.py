"""grpokit.core.stats.length_adjusted_difference: the model's difference at equal length."""

from __future__ import annotations

import numpy as np
import pytest

from grpokit.core.stats import length_adjusted_difference


def _rows(
    lengths_base: list[float], lengths_other: list[float], value
) -> list[tuple[int, bool, float, float]]:
    rows = [(i % 5, False, x, value(False, x)) for i, x in enumerate(lengths_base)]
    rows += [(i % 5, True, x, value(True, x)) for i, x in enumerate(lengths_other)]
    return rows


def test_a_score_that_is_length_plus_a_model_effect_gives_the_effect_alone() -> None:
    # value = 0.2 + 0.1 * other + 0.003 * length; the other model writes longer, so its raw
    # difference is 0.1 + 0.003 * (mean length gap) = 0.1 + 0.003 * 60 = 0.28.
    rows = _rows(
        [100, 120, 140, 160, 110, 130],
        [160, 180, 200, 220, 170, 190],
        lambda other, x: 0.2 + 0.1 * other + 0.003 * x,
    )
    raw = np.mean([v for _, o, _, v in rows if o]) - np.mean([v for _, o, _, v in rows if not o])
    assert raw == pytest.approx(0.28)
    d, lo, hi = length_adjusted_difference(rows)  # type: ignore[misc]
    # Exact data: every resample fits the same line; 1e-9 is float64 rounding of sums of ~1e5.
    assert (d, lo, hi) == pytest.approx((0.1, 0.1, 0.1), abs=1e-9)


def test_a_score_that_is_only_length_gives_no_difference() -> None:
    rows = _rows([100, 150, 120, 90, 110], [200, 260, 180, 150, 170], lambda o, x: 0.001 * x)
    d, _, _ = length_adjusted_difference(rows)  # type: ignore[misc]
    assert d == pytest.approx(0.0, abs=1e-9)


def test_it_is_the_least_squares_coefficient() -> None:
    # Against numpy's solver on noisy data; the moments are float64 sums of a few hundred
    # terms of size <= 1e5, so the two agree to far better than 1e-9.
    rng = np.random.default_rng(0)
    rows = [
        (int(rng.integers(10)), bool(o), float(rng.integers(50, 300)), float(rng.random()))
        for o in rng.integers(0, 2, size=200)
    ]
    x = np.array([[1.0, o, length] for _, o, length, _ in rows])
    y = np.array([v for *_, v in rows])
    expected = np.linalg.lstsq(x, y, rcond=None)[0][1]
    d, lo, hi = length_adjusted_difference(rows)  # type: ignore[misc]
    assert d == pytest.approx(expected, abs=1e-9)
    assert lo <= d <= hi


def test_equal_lengths_leave_the_difference_of_means() -> None:
    rows = _rows([100] * 5, [100] * 5, lambda other, x: 0.5 if other else 0.25)
    d, lo, hi = length_adjusted_difference(rows)  # type: ignore[misc]
    assert (d, lo, hi) == pytest.approx((0.25, 0.25, 0.25))


def test_no_answer_without_two_models_or_when_length_decides_the_model() -> None:
    assert length_adjusted_difference([(0, False, 10.0, 1.0), (1, False, 20.0, 0.0)]) is None
    # Every base answer 100 tokens, every other 200: the model is a linear function of length.
    assert length_adjusted_difference(_rows([100] * 3, [200] * 3, lambda o, x: float(o))) is None
    assert length_adjusted_difference([]) is None


def test_too_few_prompts_give_none_and_a_seed_repeats_it() -> None:
    # Four prompts: a percentile bootstrap over so few has too few distinct resamples.
    rows = [(x % 4, o, float(x), float(x % 7) / 7) for o in (False, True) for x in range(10, 40)]
    assert length_adjusted_difference(rows) is None
    many = _rows(
        [100, 120, 140, 90, 95, 130], [150, 110, 160, 170, 125, 200], lambda o, x: (x % 11) / 11
    )
    assert length_adjusted_difference(many, seed=3) == length_adjusted_difference(many, seed=3)


def test_the_interval_over_prompts_covers_the_model_effect() -> None:
    # 20 prompts with a shared difficulty each, 4 answers per model; a judge that likes length
    # (+0.002 a token) and a model effect of +0.05; the trained model writes 40 tokens more.
    # The percentile interval over resampled prompts should cover +0.05 about 95% of the time
    # (a percentile bootstrap over 20 clusters runs a little narrow: 0.88-0.99 accepted; 200
    # repetitions give a binomial sd of about 0.016).
    rng = np.random.default_rng(7)
    covered, reps = 0, 200
    for _ in range(reps):
        rows = []
        for p in range(20):
            difficulty = rng.normal(0, 0.1)
            for other in (False, True):
                for _ in range(4):
                    length = rng.normal(180 if other else 140, 30)
                    value = difficulty + 0.05 * other + 0.002 * length + rng.normal(0, 0.05)
                    rows.append((p, other, float(length), float(value)))
        _, lo, hi = length_adjusted_difference(rows, resamples=1000)  # type: ignore[misc]
        covered += lo <= 0.05 <= hi
    assert 0.88 <= covered / reps <= 0.99
