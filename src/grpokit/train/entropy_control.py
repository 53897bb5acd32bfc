"""The trainer's side of entropy control (training.top_entropy_quantile, entropy_coef,
use_adaptive_entropy ...): the maths is grpokit.core.entropy; this keeps the controller's state
in the :class:`TrainerState` (so a resumed run continues it) and turns one micro-batch's
entropies into the policy term's mask, the bonus and the metrics the controller reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpokit.core.entropy import (
    EntropyControl,
    applied_entropy_coef,
    entropy_bonus,
    high_entropy_mask,
    next_entropy_coef,
)
from grpokit.train.checkpoint import TrainerState

__all__ = ["EntropyStep", "MicroBatchEntropy"]

_TRAINED_SUM = "entropy/trained_sum"
"""Per micro-batch sum(H over trained tokens) / its active tokens: token-weighted like every loss
metric, so that across micro-batches and ranks it becomes the step's sum over its tokens."""
_TRAINED_FRAC = "entropy/trained_frac"


@dataclass(frozen=True)
class MicroBatchEntropy:
    """One micro-batch's share: the policy term's mask (None: every token), the bonus to subtract
    from the loss (0-d, None without one) and metrics to add to the loss's."""

    policy_mask: torch.Tensor | None
    bonus: torch.Tensor | None
    metrics: dict[str, torch.Tensor]


@dataclass(frozen=True)
class EntropyStep:
    """Entropy control during one optimizer step: the settings and the coefficient it applies
    (fixed for the whole step, from the state at its start, as in TRL)."""

    control: EntropyControl
    coef: float

    @classmethod
    def start(cls, control: EntropyControl, state: TrainerState) -> EntropyStep:
        coef = control.entropy_coef if state.entropy_coef is None else state.entropy_coef
        last = math.inf if state.last_entropy is None else state.last_entropy
        return cls(control, applied_entropy_coef(control, coef, last))

    @property
    def active(self) -> bool:
        """Whether this step reads the entropies at all (a mask, a bonus or the controller)."""
        return self.control.masks_tokens or self.control.bonus

    @property
    def entropy_grad(self) -> bool:
        """Whether the entropies need a gradient: only when a bonus is applied this step (the
        controller may hold it at 0, and then the entropy is only measured)."""
        return self.coef != 0.0

    def micro_batch(
        self,
        entropy: torch.Tensor,
        mask: torch.Tensor,
        num_active_tokens: torch.Tensor | float | None,
    ) -> MicroBatchEntropy:
        """entropy (B, T) (with gradient when :attr:`entropy_grad`), mask (B, T) float: the
        loss's mask; num_active_tokens: the step's (all ranks)."""
        policy_mask = None
        if self.control.masks_tokens:
            keep = high_entropy_mask(entropy, mask, self.control.top_entropy_quantile)
            policy_mask = keep.to(mask.dtype)
        trained = mask if policy_mask is None else mask * policy_mask
        bonus = None
        if self.coef != 0.0:
            bonus = self.coef * entropy_bonus(entropy, trained, num_active_tokens)
        n = mask.detach().sum().double().clamp(min=1.0)
        picked = torch.where(trained != 0, entropy.detach().double(), 0.0)
        metrics = {
            _TRAINED_SUM: picked.sum() / n,
            _TRAINED_FRAC: (trained != 0).sum().double() / n,
        }
        return MicroBatchEntropy(policy_mask, bonus, metrics)

    def finish(self, metrics: dict[str, float], state: TrainerState) -> None:
        """After the optimizer step, with its metrics reduced over micro-batches and ranks:
        replace the internal sum by ``entropy/trained`` (the mean per-token entropy of the tokens
        the policy term trained), move the adaptive coefficient and log it as ``entropy_coef``
        (TRL's name)."""
        total = metrics.pop(_TRAINED_SUM, math.nan)
        frac = metrics.get(_TRAINED_FRAC, 0.0)
        measured = total / frac if frac > 0 else math.nan
        metrics["entropy/trained"] = measured
        coef = self.control.entropy_coef if state.entropy_coef is None else state.entropy_coef
        if self.control.use_adaptive_entropy:
            coef = next_entropy_coef(self.control, coef, measured)
            state.entropy_coef = coef
            if not math.isnan(measured):
                state.last_entropy = measured
        if self.control.bonus:
            metrics["entropy_coef"] = coef
