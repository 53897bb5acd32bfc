"""Pairwise judging: the reading of A/B from log-probs and the win rate, position bias and
length-controlled win rate, each against a hand computation."""

from __future__ import annotations

import math

import pytest

from grpokit.evaluate.pairwise import (
    PairVerdict,
    first_probability,
    length_controlled_win_rate,
    position_bias,
    win_rate,
)
from grpokit.rewards.judge.expected import TokenLogprob


def test_the_first_letter_is_read_with_its_alternatives() -> None:
    tokens = [
        TokenLogprob(0, "A", math.log(0.6),
                     (("A", math.log(0.6)), ("B", math.log(0.3)), (" A", math.log(0.05)),
                      ("The", math.log(0.05)))),
    ]  # fmt: skip
    assert first_probability("A", tokens) == pytest.approx(0.65 / 0.95)
    # Written after other text: the token at the letter is read.
    tokens = [
        TokenLogprob(0, "Answer", 0.0, ()),
        TokenLogprob(6, ":", 0.0, ()),
        TokenLogprob(7, " B", math.log(0.8), ((" B", math.log(0.8)), (" A", math.log(0.2)))),
    ]
    assert first_probability("Answer: B", tokens) == pytest.approx(0.2)
    assert first_probability("Both are good.", []) is None
    assert first_probability("B is better", []) == 0.0  # no log-probs: the written letter


def _v(prompt: int, win_x_first: float, win_y_first: float, dx: int = 0) -> PairVerdict:
    return PairVerdict(prompt, 0, win_x_first, win_y_first, 100 + dx, 100)


def test_win_rate_is_pooled_with_prompts_as_units() -> None:
    verdicts = [
        _v(0, 1.0, 1.0), _v(0, 0.5, 0.5),  # prompt 0: wins 1.0 and 0.5
        _v(1, 0.5, 1.0),                   # prompt 1: 0.75
        _v(2, 0.0, 0.0), _v(2, 0.5, 0.0),  # prompt 2: 0.0 and 0.25
        PairVerdict(3, 0, None, None, 10, 10),  # no answer either way: left out
    ]  # fmt: skip
    mean, low, high = win_rate(verdicts)
    # Pooled mean 2.5 / 5. Cluster-robust: sums 1.5, 0.75, 0.25 of sizes 2, 1, 2; residuals
    # 0.5, 0.25, -0.75; variance 3/2 * 0.875 / 25 = 0.0525, se 0.229129; t(0.975, 2) = 4.302653.
    assert mean == pytest.approx(0.5)
    assert (low, high) == pytest.approx((0.5 - 0.985859, 0.5 + 0.985859), abs=1e-5)
    assert verdicts[2].win == pytest.approx(0.75)
    # One order unanswered: the other stands alone.
    assert PairVerdict(0, 0, None, 0.3, 1, 1).win == 0.3


def test_position_bias_is_how_often_the_answer_shown_first_wins() -> None:
    # Shown first, X won with 0.8; with Y shown first X still won 0.6, so the first won 0.4.
    assert position_bias([_v(0, 0.8, 0.6)]) == pytest.approx(0.6)
    assert position_bias([PairVerdict(0, 0, 0.9, None, 1, 1)]) == pytest.approx(0.9)


def test_a_win_that_is_only_length_vanishes_at_equal_length() -> None:
    # Every pair on the line win = 0.5 + 0.01 * (X's length - Y's): X wins 64% of the time
    # because it writes more, and exactly half at equal length.
    pairs = [(0, 10), (0, 20), (1, 0), (1, 30), (2, 10)]
    verdicts = [_v(p, 0.5 + 0.01 * d, 0.5 + 0.01 * d, dx=d) for p, d in pairs]
    assert win_rate(verdicts)[0] == pytest.approx(0.64)
    estimate, low, high = length_controlled_win_rate(verdicts, resamples=500, seed=1)
    assert estimate == pytest.approx(0.5)
    # A resample of prompt 2 alone has one length difference and no slope: its plain mean.
    assert low == pytest.approx(0.5) and 0.5 <= high <= 0.6
    # Equal lengths everywhere: the plain mean.
    flat = [_v(0, 0.7, 0.7), _v(1, 0.9, 0.9)]
    assert length_controlled_win_rate(flat, resamples=50)[0] == pytest.approx(0.8)
