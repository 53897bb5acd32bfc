"""The generation rounds' prompts, sampled and scored, with their advantages: in order from the
prompt stream, and with an engine that generates ahead, the next rounds' generation overlapping
this round's update."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from grpokit.data.prompts import PromptRow
from grpokit.errors import UserError
from grpokit.sampling import Sampler
from grpokit.train.curriculum import PromptCurriculum
from grpokit.train.data_order import PromptStream
from grpokit.train.distributed import DistContext, shard_slice
from grpokit.train.rollout_record import Rollout


@dataclass
class _Taken:
    rows: list[PromptRow]
    epoch: int
    position: int
    indices: list[int]


class Rollouts:
    """Takes each round's prompts from the stream (every rank the same global rows, each its
    share of groups), samples and scores them, and computes their ``advantages`` (from the
    rewards' total (B,) and per-function (B, F) values).

    With ``max_staleness`` > 0 (an engine that generates ahead, grpokit.rollout.ahead), the
    prompts of up to ``max_staleness`` later rounds are taken and handed to the engine before this
    round is scored, so their generation runs while this round's update does. A round taken k
    rounds ahead is sampled from weights at most k updates older than those trained on it.
    Scoring stays on this (the main) thread: some rewards need it (signal-based time limits).

    With a ``curriculum``, the stream passes over the prompts it does not keep.
    """

    def __init__(
        self,
        stream: PromptStream,
        sampler: Sampler,
        dist: DistContext,
        *,
        num_generations: int,
        generator: torch.Generator,
        advantages: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        mask_truncated_completions: bool,
        max_staleness: int = 0,
        curriculum: PromptCurriculum | None = None,
    ) -> None:
        if max_staleness and sampler.tools is not None:
            raise UserError(
                "training.max_staleness: generating ahead takes single-turn rollouts; with "
                "tools a turn's prompt depends on the turn before. Set max_staleness: 0"
            )
        self.stream = stream
        self.sampler = sampler
        self.dist = dist
        self.num_generations = num_generations
        self.generator = generator
        self.advantages = advantages
        self.mask_truncated_completions = mask_truncated_completions
        self.max_staleness = max_staleness
        self.curriculum = curriculum
        self._taken: deque[_Taken] = deque()

    def next(self, prompts: int, *, later_rounds: int) -> Rollout:
        """This round's ``prompts`` prompts (over all ranks), sampled, scored and their
        advantages computed; ``later_rounds``: how many rounds the run has after this one (none
        is taken beyond)."""
        if not self._taken:
            self._take(prompts)
        taken = self._taken.popleft()
        while len(self._taken) < min(self.max_staleness, later_rounds):
            self._take(prompts)
        scored = self.sampler.sample(taken.rows, self.num_generations, generator=self.generator)
        metrics: dict[str, float] = {}
        sampled_at = scored.rollout.weight_version
        current = self.sampler.engine.weight_version
        if self.max_staleness and sampled_at is not None and current is not None:
            staleness = current - sampled_at
            if not 0 <= staleness <= self.max_staleness:
                raise RuntimeError(
                    f"a batch {staleness} weight updates old, outside 0..{self.max_staleness}"
                )
            metrics["staleness"] = float(staleness)
        scores = scored.scores
        return Rollout.of_round(
            scored,
            self.advantages(scores.total, scores.per_function),
            mask_truncated=self.mask_truncated_completions,
            epoch=taken.epoch,
            position=taken.position,
            indices=taken.indices,
            metrics=metrics,
        )

    def _take(self, prompts: int) -> None:
        world = self.dist.world_size
        curriculum = self.curriculum
        keep = curriculum.keep if curriculum is not None else None
        indices, passed = self.stream.take_indices(-(-prompts // world) * world, keep)
        if curriculum is not None:
            curriculum.passed_over += passed
        rows = [self.stream.rows[i] for i in indices][shard_slice(len(indices), self.dist)]
        self._taken.append(_Taken(rows, self.stream.epoch, self.stream.position, indices))
        if self.max_staleness:
            self.sampler.prefetch(rows, self.num_generations)
