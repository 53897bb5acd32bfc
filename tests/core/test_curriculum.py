"""The pass-rate curriculum's rule (grpokit.core.curriculum) against hand-worked cases."""

from __future__ import annotations

import math

import pytest

from grpokit.core.curriculum import (
    Curriculum,
    PromptRecord,
    keep_draw,
    pool_of,
    pool_sizes,
    record_group,
    records_from_json,
    records_to_json,
)


def test_a_record_keeps_the_count_and_the_last_group() -> None:
    first = record_group(None, 0.75, flat=False)
    assert first == PromptRecord(groups=1, mean=0.75, flat=False)
    second = record_group(first, 1.0, flat=True)
    assert second == PromptRecord(groups=2, mean=1.0, flat=True)
    # A group with no score at all (every reward None) tells nothing.
    assert record_group(second, math.nan, flat=True) is second
    assert record_group(None, math.nan, flat=True) == PromptRecord()


@pytest.mark.parametrize(
    ("record", "pool"),
    [
        (None, "normal"),  # never drawn
        (PromptRecord(), "normal"),  # drawn, never scored
        (PromptRecord(3, 1.0, flat=False), "normal"),  # a spread: a learning signal
        (PromptRecord(1, 1.0, flat=True), "easy"),  # all right
        (PromptRecord(1, 0.5, flat=True), "easy"),  # at the threshold counts as easy
        (PromptRecord(1, 0.0, flat=True), "hard"),  # all wrong
        (PromptRecord(2, 0.2, flat=True), "hard"),  # well formatted (0.2) but every answer wrong
        (PromptRecord(2, 1.2, flat=True), "easy"),  # format 0.2 + answer 1, every completion
    ],
)
def test_pools(record: PromptRecord | None, pool: str) -> None:
    assert pool_of(record, easy_threshold=0.5) == pool


def test_pool_sizes_count_unseen_prompts_as_normal() -> None:
    records = {
        0: PromptRecord(1, 1.0, True),  # easy
        3: PromptRecord(2, 0.0, True),  # hard
        4: PromptRecord(1, 0.0, True),  # hard
        7: PromptRecord(1, 0.25, False),  # normal
    }
    assert pool_sizes(records, 10, 0.5) == {"easy": 1, "normal": 7, "hard": 2}


def test_keep_probabilities_by_pool() -> None:
    c = Curriculum(easy_threshold=0.5, easy_keep_prob=0.25, hard_keep_prob=0.0)
    assert (c.keep_prob("easy"), c.keep_prob("normal"), c.keep_prob("hard")) == (0.25, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"easy_keep_prob must be in \[0, 1\], got 1.5"):
        Curriculum(easy_keep_prob=1.5)


def test_keep_draws_depend_only_on_the_slot() -> None:
    draws = [keep_draw(7, epoch, pos) for epoch in range(4) for pos in range(500)]
    assert draws == [keep_draw(7, epoch, pos) for epoch in range(4) for pos in range(500)]
    assert all(0.0 <= d < 1.0 for d in draws)
    assert draws != [keep_draw(8, epoch, pos) for epoch in range(4) for pos in range(500)]
    # Uniform: the share below p is about p (2000 draws: 3 standard deviations is 0.034).
    for p in (0.1, 0.5, 0.9):
        assert abs(sum(d < p for d in draws) / len(draws) - p) < 0.034


def test_records_round_trip_through_json() -> None:
    records = {2: PromptRecord(1, 1.0, True), 11: PromptRecord(4, 0.375, False)}
    data = records_to_json(sorted(records.items()))
    assert data == {"2": [1, 1.0, True], "11": [4, 0.375, False]}
    assert records_from_json(data) == records
    # A record with no scored group is not saved (it is the same as none).
    assert records_to_json([(5, PromptRecord())]) == {}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object, got list"),
        ({"a": [1, 1.0, True]}, "key 'a' is not a prompt index"),
        ({"1": [1, 1.0]}, r"prompt 1: expected \[groups, mean, flat\]"),
        ({"1": [0, 1.0, True]}, r"prompt 1: expected"),
        ({"1": [1, "x", True]}, r"prompt 1: expected"),
        ({"1": [1, 1.0, 1]}, r"prompt 1: expected"),
        ({"1": [True, 1.0, True]}, r"prompt 1: expected"),
    ],
)
def test_malformed_records_are_named(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        records_from_json(data)
