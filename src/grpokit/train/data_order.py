"""The order prompts are trained in: a seeded shuffle per epoch, resumable from (epoch, position)."""

from __future__ import annotations

import torch

from grpokit.data.prompts import PromptRow


class PromptStream:
    """Yields prompt rows in a per-epoch seeded order; `epoch`/`position` are the resume point.

    The order of epoch e depends only on (seed, e), so resuming needs nothing but the position,
    and no prompt is skipped or repeated across a resume.
    """

    def __init__(self, rows: list[PromptRow], *, seed: int, shuffle: bool = True) -> None:
        self.rows = rows
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._order_of(0)

    def _order_of(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.rows)))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.rows), generator=g).tolist()

    def seek(self, epoch: int, position: int) -> None:
        self.epoch, self.position = epoch, position
        self._order = self._order_of(epoch)

    def take(self, n: int) -> list[PromptRow]:
        out: list[PromptRow] = []
        while len(out) < n:
            if self.position >= len(self._order):
                self.seek(self.epoch + 1, 0)
            out.append(self.rows[self._order[self.position]])
            self.position += 1
        return out

    @property
    def epoch_float(self) -> float:
        return self.epoch + self.position / len(self.rows)
