"""A reward called as the reward set calls it, for tests that read what it reports besides its
values (metrics, parts, a judge's outcomes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpokit.rewards import Reward, RewardBatch, RewardResult
from grpokit.rewards.judge.reward import JudgedBatch


def evaluate(
    reward: Reward, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
) -> RewardResult:
    """``reward``'s result for one batch (``columns``: one value per completion each)."""
    return reward.evaluate(RewardBatch(list(prompts), list(completions), columns))


def judged(result: RewardResult) -> JudgedBatch:
    """A judge reward's details of the call that gave ``result`` (outcomes, groups, warning)."""
    assert result.judged is not None
    return result.judged
