"""The order prompts are trained in: a seeded shuffle per epoch, resumable from (epoch, position)."""

from __future__ import annotations

from collections.abc import Callable

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
        return [self.rows[i] for i in self.take_indices(n)[0]]

    def take_indices(
        self, n: int, keep: Callable[[int, int, int], bool] | None = None
    ) -> tuple[list[int], int]:
        """The next ``n`` prompts' indices into ``rows``, and how many were passed over.

        ``keep(index, epoch, position)``: whether to take the prompt at that slot (a curriculum;
        default all). Once as many prompts as the data set holds have been passed over in one
        call, the rest are taken as they come, so that a data set whose prompts all fail
        ``keep`` still fills the step.
        """
        out: list[int] = []
        passed = 0
        while len(out) < n:
            if self.position >= len(self._order):
                self.seek(self.epoch + 1, 0)
            index = self._order[self.position]
            if keep is None or passed >= len(self.rows) or keep(index, self.epoch, self.position):
                out.append(index)
            else:
                passed += 1
            self.position += 1
        return out, passed

    @property
    def epoch_float(self) -> float:
        return self.epoch + self.position / len(self.rows)
