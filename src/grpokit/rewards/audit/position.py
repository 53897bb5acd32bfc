"""Position bias of a group judge: how much more (or less) the same answer scores when it is
shown first, or last, among its group's answers.

Group scoring (``scoring: group``) shows a prompt's answers together, numbered in a drawn order,
and judges are known to favour some numbers, often the first or the last shown. The audit shows
every group in another order on every repeat, so each answer is seen at several positions; the
bias is measured within answers, which takes the answers' own quality out of it: for each answer
seen both at the slot and elsewhere, its mean score at the slot minus its mean score elsewhere,
averaged over answers, with an interval over prompts (an answer's repeats and a prompt's answers
are not independent, so prompts are the units).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grpokit.core.stats import cluster_mean_stderr, t_quantile_975

Shown = tuple[int, int, float | None]
"""One repeat of one answer: (the number it was shown under, 1-based; how many answers its group
showed; its score, None where the judge gave none)."""

SLOTS: dict[str, Callable[[int, int], bool]] = {
    "first": lambda number, size: number == 1,
    "last": lambda number, size: number == size,
}
"""The slots reported, as tests on (number, group size)."""


@dataclass(frozen=True)
class PositionBias:
    """One slot's bias for one judge."""

    slot: str
    """"first" or "last"."""
    contrast: float
    """Mean over answers of (mean score at the slot - mean score elsewhere); NaN with none."""
    low: float
    """95% interval over prompts (NaN with fewer than two prompts)."""
    high: float
    answers: int
    """Answers seen both at the slot and elsewhere (groups of one answer never are)."""
    prompts: int


def _contrast(seen: Sequence[Shown], at_slot: Callable[[int, int], bool]) -> float | None:
    """One answer's mean score at the slot minus elsewhere; None unless it was scored in both."""
    there = [s for n, size, s in seen if s is not None and at_slot(n, size)]
    elsewhere = [s for n, size, s in seen if s is not None and not at_slot(n, size)]
    if not there or not elsewhere:
        return None
    return statistics.fmean(there) - statistics.fmean(elsewhere)


def position_bias(shown: Sequence[Sequence[Shown]], prompts: Sequence[str]) -> list[PositionBias]:
    """The first- and last-slot bias of one judge over answers seen in several orders.

    Args:
        shown: ``shown[i]`` the repeats of answer i, each as (number, group size, score).
        prompts: ``prompts[i]`` the prompt answer i answers (the unit of the interval).

    >>> seen = [[(1, 2, 0.7), (2, 2, 0.6)], [(2, 2, 0.8), (1, 2, 0.9)]]
    >>> [round(b.contrast, 3) for b in position_bias(seen, ["p", "p"])]
    [0.1, -0.1]
    """
    out = []
    for slot, at_slot in SLOTS.items():
        by_prompt: dict[str, list[float]] = {}
        for seen, prompt in zip(shown, prompts, strict=True):
            value = _contrast(seen, at_slot)
            if value is not None:
                by_prompt.setdefault(prompt, []).append(value)
        values = [v for group in by_prompt.values() for v in group]
        mean = statistics.fmean(values) if values else math.nan
        stderr = cluster_mean_stderr(list(by_prompt.values()))
        half = math.nan if stderr is None else t_quantile_975(len(by_prompt) - 1) * stderr
        out.append(PositionBias(slot, mean, mean - half, mean + half, len(values), len(by_prompt)))
    return out


__all__ = ["PositionBias", "Shown", "position_bias"]
