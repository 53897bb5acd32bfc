"""Step metrics that need more than TRL's: which zero-std groups are solved rather than stalled."""

from __future__ import annotations

import math

import torch

from grpokit.rewards.compose import RewardScores
from grpokit.train.step_metrics import solved_group_mask


def _scores(rows: list[list[float]]) -> RewardScores:
    per = torch.tensor(rows, dtype=torch.float32)
    return RewardScores(
        names=["format", "answer"],
        per_function=per,
        gated_out=torch.zeros_like(per, dtype=torch.bool),
        total=per.nan_to_num(0).sum(dim=1),
        metrics={},
    )


def test_a_group_is_solved_when_every_completion_tops_every_reward() -> None:
    nan = math.nan
    scores = _scores(
        [
            [1.0, 1.0], [1.0, 1.0],  # solved
            [1.0, 0.0], [1.0, 0.0],  # the same reward, unsolved: stalled
            [1.0, 1.0], [1.0, nan],  # a reward not given is not reached
        ]
    )  # fmt: skip
    mask = solved_group_mask(scores, [1.0, 1.0], group_size=2)
    assert mask is not None and mask.tolist() == [True, False, False]
    # a reward without a maximum: no way to tell solved from stalled
    assert solved_group_mask(scores, [1.0, None], group_size=2) is None
