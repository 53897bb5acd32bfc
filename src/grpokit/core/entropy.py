"""Entropy control: train on the highest-entropy tokens, and an (adaptive) entropy bonus
(docs/math.md, "Entropy control").

- :func:`high_entropy_mask` keeps the tokens whose entropy is at or above the (1 - rho) quantile
  of a batch's token entropies (rho = ``top_entropy_quantile``; Wang et al. 2025, "Beyond the
  80/20 Rule", arXiv 2506.01939: the policy gradient of the ~20% "forking" tokens carries the
  learning). rho = 1 keeps every token, rho = 0 only the highest-entropy one(s).
- :func:`entropy_bonus` is the mean per-token entropy H of the step, which the loss subtracts
  times a coefficient: L = L_policy - coef * H.
- :func:`next_entropy_coef` and :func:`applied_entropy_coef` are Skywork-OR1's adaptive control
  (He et al. 2025, arXiv 2505.22312): the coefficient climbs by delta after each optimizer step
  whose entropy was at or below the target and falls by delta otherwise, within [min, max], and
  is applied only while the last measured entropy is at or below the target.

Names, defaults and semantics are TRL 1.16's (``GRPOConfig.top_entropy_quantile``,
``entropy_coef``, ``use_adaptive_entropy``, ``entropy_coef_min`` / ``_max`` / ``_delta``,
``entropy_target``). Pure functions of tensors and floats; the trainer keeps the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "EntropyControl",
    "applied_entropy_coef",
    "entropy_bonus",
    "entropy_threshold",
    "high_entropy_mask",
    "next_entropy_coef",
]


@dataclass(frozen=True)
class EntropyControl:
    """The entropy settings of a run (TRL's names and defaults; all off by default).

    top_entropy_quantile: rho in [0, 1]; the share of each batch's tokens, by entropy, whose
        policy term is trained (1: all).
    entropy_coef: the bonus's coefficient (0: none); with ``use_adaptive_entropy`` its start.
    use_adaptive_entropy: Skywork-OR1's controller moves the coefficient each optimizer step.
    entropy_coef_min, entropy_coef_max: the controller's bounds.
    entropy_coef_delta: the controller's step (>= 0).
    entropy_target: the entropy (nats per token) at or below which the bonus is applied and grows.
    """

    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    use_adaptive_entropy: bool = False
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise ValueError(
                f"top_entropy_quantile must be in [0, 1], got {self.top_entropy_quantile}"
            )
        if self.entropy_coef_delta < 0:
            raise ValueError(f"entropy_coef_delta must be >= 0, got {self.entropy_coef_delta}")
        if self.use_adaptive_entropy and self.entropy_coef_min > self.entropy_coef_max:
            raise ValueError(
                f"entropy_coef_min ({self.entropy_coef_min}) must not exceed entropy_coef_max "
                f"({self.entropy_coef_max})"
            )

    @property
    def masks_tokens(self) -> bool:
        """Whether the policy term is restricted to the high-entropy tokens."""
        return self.top_entropy_quantile < 1.0

    @property
    def bonus(self) -> bool:
        """Whether the loss has an entropy term: a coefficient, or the controller (which may
        bring a coefficient of 0 back up), as in TRL."""
        return self.entropy_coef != 0.0 or self.use_adaptive_entropy


def entropy_threshold(entropies: Tensor, quantile: float) -> Tensor | None:
    """The entropy at the (1 - ``quantile``) quantile of ``entropies`` (N,), linear interpolation
    between order statistics (torch.quantile's default, as TRL); None when N = 0.

    Returns a 0-d tensor: the smallest value for quantile 1, the largest for quantile 0.
    """
    if entropies.numel() == 0:
        return None
    return torch.quantile(entropies.detach().double(), 1.0 - quantile)


def high_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """Tokens whose entropy is at or above the (1 - ``quantile``) quantile of the active tokens'.

    entropy: (B, T) per-token entropy; mask: (B, T), nonzero on the tokens that count. Returns a
    (B, T) bool mask, false wherever ``mask`` is 0. ``quantile`` 1 keeps every active token;
    ``quantile`` 0 keeps those equal to the largest entropy. Ties at the threshold are kept, so
    slightly more than a ``quantile`` share may pass (as in TRL).
    """
    if entropy.shape != mask.shape:
        raise ValueError(
            f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must have one shape"
        )
    active = mask != 0
    threshold = entropy_threshold(entropy[active], quantile)
    if threshold is None:
        return torch.zeros_like(active)
    return active & (entropy.detach().double() >= threshold)


def entropy_bonus(
    entropy: Tensor, mask: Tensor, num_active_tokens: Tensor | float | None
) -> Tensor:
    """sum(H * mask) / num_active_tokens: this micro-batch's share of the step's mean per-token
    entropy, so that the micro-batches of an optimizer step sum to it however the step is split.

    entropy: (B, T), with gradient where the bonus should train; mask: (B, T) float weights (0 on
    padding and, with top_entropy_quantile, on the tokens the policy term leaves out);
    num_active_tokens: the step's active tokens (all processes), None for this call's mask sum.
    Returns a 0-d tensor. Padding never reaches the value or the gradient (selected, not
    multiplied).
    """
    active = mask != 0
    picked = torch.where(active, entropy * mask.to(entropy.dtype), torch.zeros_like(entropy))
    if num_active_tokens is None:
        return picked.sum() / active.sum().clamp(min=1).to(picked.dtype)
    tokens = torch.as_tensor(num_active_tokens, dtype=picked.dtype, device=picked.device)
    return picked.sum() / tokens.clamp(min=1.0)


def applied_entropy_coef(control: EntropyControl, coef: float, last_entropy: float) -> float:
    """The coefficient a step applies: ``coef``; under adaptive control only while the entropy
    measured at the end of the previous step (``last_entropy``, inf before the first) is at or
    below the target, else 0 (the bonus stays out of a run whose entropy is healthy)."""
    if control.use_adaptive_entropy and not last_entropy <= control.entropy_target:
        return 0.0
    return coef


def next_entropy_coef(control: EntropyControl, coef: float, entropy: float) -> float:
    """The adaptive coefficient after an optimizer step whose mean per-token entropy (over the
    tokens the policy term trained) was ``entropy``: up by delta at or below the target, down by
    delta above it, clamped to [entropy_coef_min, entropy_coef_max]. A NaN entropy (a step with
    no tokens) leaves it unchanged. Without adaptive control: ``coef``."""
    if not control.use_adaptive_entropy or math.isnan(entropy):
        return coef
    if entropy <= control.entropy_target:
        return min(coef + control.entropy_coef_delta, control.entropy_coef_max)
    return max(coef - control.entropy_coef_delta, control.entropy_coef_min)
