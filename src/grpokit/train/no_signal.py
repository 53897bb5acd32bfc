"""Saying so when training has nothing to learn from: every group's completions got the same
reward, so every advantage, the loss and the gradient are 0 (the cold start ``grpokit
preflight`` finds before a run). The run goes on, as rewards may start to differ, but nobody
should wait hours for a curve that cannot move without a word."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from grpokit.config import GRPOKitConfig
from grpokit.sampling import Sampler, ScoredBatch

NO_SIGNAL_STEPS = 3
"""Optimizer steps in a row without a learning signal before the trainer warns (one step alone
is common early in a run with a strict reward)."""

Advice = Callable[[GRPOKitConfig, Sampler, list[ScoredBatch]], list[str]]
"""preflight's reasons and advice on the samples of the steps without a signal
(:func:`grpokit.preflight.run.advice_on_steps`). The command passes it in: train may not import
preflight (tests/test_layers.py)."""


@dataclass
class NoSignalWatch:
    """Counts the optimizer steps in a row whose every group had equal rewards and keeps their
    samples, for the warning and its advice."""

    steps: int = NO_SIGNAL_STEPS
    streak: int = 0
    batches: list[ScoredBatch] = field(default_factory=list)

    def update(self, flat: bool, scored: ScoredBatch, steps: int) -> bool:
        """One generation round of ``steps`` optimizer steps, trained on ``scored``; ``flat``:
        no group had a reward spread. True once a streak, when it reaches ``self.steps``."""
        if not flat:
            self.streak, self.batches = 0, []
            return False
        before = self.streak
        self.streak += steps
        self.batches.append(scored)
        return before < self.steps <= self.streak


def no_signal_warning(last_step: int, streak: int, advice: list[str] | None) -> str:
    """The warning: why the gradient is 0, and what to do (``advice``: preflight's words on
    these steps' samples; None: where to get them)."""
    first = last_step - streak + 1
    head = (
        f"[no signal] steps {first}-{last_step}: in every group all completions got the same "
        "reward, so every advantage, the loss and the gradient are 0 and training learns "
        "nothing from them."
    )
    if advice is None:
        return head + " `grpokit preflight CONFIG` measures why and says what to do."
    return "\n".join(
        [head + " grpokit preflight's verdict on their samples:", *(f"  - {a}" for a in advice)]
    )
