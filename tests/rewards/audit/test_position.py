"""The position bias of a group judge, measured within answers (rewards/audit/position.py)."""

from __future__ import annotations

import math

import pytest

from grpokit.core.stats import t_quantile_975
from grpokit.rewards.audit.position import position_bias


def test_bias_is_measured_within_answers_with_an_interval_over_prompts() -> None:
    """Three prompts, groups of three: each answer's score at the slot minus elsewhere, averaged
    over answers; the interval treats a prompt's answers as one unit."""
    shown = [
        # prompt a: one answer first once (0.9) and second twice (0.5, 0.7): first +0.3
        [(1, 3, 0.9), (2, 3, 0.5), (2, 3, 0.7)],
        # prompt a: never first (no first contrast); last once (0.2) against 0.4, 0.6: last -0.3
        [(3, 3, 0.2), (2, 3, 0.4), (2, 3, 0.6)],
        # prompt b: first 0.5 against last 0.5 and a failed score (skipped): first 0, last 0
        [(1, 3, 0.5), (3, 3, 0.5), (2, 3, None)],
        # prompt c: first +0.2; never last
        [(1, 3, 0.6), (2, 3, 0.4)],
        # a group of one answer: always first and last, never elsewhere: no contrast
        [(1, 1, 1.0), (1, 1, 0.0)],
    ]
    prompts = ["a", "a", "b", "c", "d"]
    first, last = position_bias(shown, prompts)
    assert (first.slot, first.answers, first.prompts) == ("first", 3, 3)
    assert first.contrast == pytest.approx((0.3 + 0.0 + 0.2) / 3)
    # Three prompts of one answer each: the interval is the t interval of their three contrasts.
    values = [0.3, 0.0, 0.2]
    half = t_quantile_975(2) * math.sqrt(sum((v - sum(values) / 3) ** 2 for v in values) / 2 / 3)
    assert (first.low, first.high) == pytest.approx((first.contrast - half, first.contrast + half))
    assert (last.slot, last.answers, last.prompts) == ("last", 2, 2)
    assert last.contrast == pytest.approx((-0.3 + 0.0) / 2)


def test_one_prompt_gives_no_interval_and_no_answers_no_figure() -> None:
    (first, last) = position_bias([[(1, 2, 0.8), (2, 2, 0.6)]], ["p"])
    assert first.contrast == pytest.approx(0.2) and math.isnan(first.low)
    assert last.contrast == pytest.approx(-0.2)
    empty = position_bias([[(1, 1, 0.5)]], ["p"])
    assert all(b.answers == 0 and math.isnan(b.contrast) for b in empty)
