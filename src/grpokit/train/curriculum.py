"""The run's pass-rate curriculum (training.curriculum): the records of every prompt drawn, the
prompt order's keep decision, and the pool sizes logged each step. The rule itself is
:mod:`grpokit.core.curriculum`."""

from __future__ import annotations

from typing import Any

import torch

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


class PromptCurriculum:
    """Per-prompt records, keyed by the prompt's index in the training rows.

    Every process holds the same records (each is given the whole round's groups), so every
    process keeps and passes over the same prompts.
    """

    def __init__(self, settings: Curriculum, *, num_prompts: int, seed: int) -> None:
        self.settings = settings
        self.num_prompts = num_prompts
        self.seed = seed
        self.records: dict[int, PromptRecord] = {}
        self.passed_over = 0
        """Prompts passed over since the last :meth:`metrics`."""

    def keep(self, index: int, epoch: int, position: int) -> bool:
        """Whether the prompt order takes prompt ``index`` at (epoch, position)."""
        pool = pool_of(self.records.get(index), self.settings.easy_threshold)
        p = self.settings.keep_prob(pool)
        return p >= 1.0 or keep_draw(self.seed, epoch, position) < p

    def observe(self, indices: list[int], total: torch.Tensor, flat: torch.Tensor) -> None:
        """Record one round's groups: prompt ``indices`` (G completions each, in order), their
        total rewards ``total`` (len(indices) * G,; NaN where every reward was None) and which
        groups were ``flat`` (len(indices),)."""
        means = total.detach().float().cpu().view(len(indices), -1).nanmean(dim=1).tolist()
        for index, mean, is_flat in zip(indices, means, flat.tolist(), strict=True):
            record = record_group(self.records.get(index), mean, bool(is_flat))
            if record.groups:  # a prompt never scored has no record
                self.records[index] = record

    def metrics(self) -> dict[str, float]:
        """The pools' sizes (prompts; unseen ones are normal) and the prompts passed over since
        the last call."""
        sizes = pool_sizes(self.records, self.num_prompts, self.settings.easy_threshold)
        out = {f"curriculum/{pool}": float(n) for pool, n in sizes.items()}
        out["curriculum/passed_over"] = float(self.passed_over)
        self.passed_over = 0
        return out

    def state(self) -> dict[str, list[object]]:
        """The records as saved with a checkpoint (curriculum.json)."""
        return records_to_json(sorted(self.records.items()))

    def parse(self, data: Any) -> dict[int, PromptRecord]:
        """Records saved by :meth:`state`, checked (raises ValueError naming what is malformed
        or out of range); nothing changes here."""
        records = records_from_json(data)
        beyond = [i for i in records if i >= self.num_prompts]
        if beyond:
            raise ValueError(
                f"prompt {beyond[0]} is beyond the {self.num_prompts} training prompts"
            )
        return records

    def snapshot(self) -> dict[int, PromptRecord]:
        """A copy of the records (they are immutable, the mapping is not)."""
        return dict(self.records)
