"""The clipped GRPO policy loss with a k3 KL penalty, and its loss aggregations (math.md 2-3).

Per token (i = completion, t = token):

    w_{i,t}   = exp(logp - old_logp)                     importance_sampling_level="token"
              = s_i = exp(mean_t(logp - old_logp))       importance_sampling_level="sequence" (GSPO)
    l_{i,t}   = -min(min(w, delta) * A_i, clip(w, 1 - epsilon_low, 1 + epsilon_high) * A_i)
                + beta * k3(logp, ref_logp)

then one aggregation (``loss_type``) turns the masked (B, T) losses into a scalar:

    grpo     mean_i( sum_t l M / sum_t M )             per-sequence mean, then mean over sequences
    bnpo     sum l M / sum M                           token mean over this batch
    dapo     sum l M / num_active_tokens               token mean over the whole optimizer step
    dr_grpo  sum l M / (num_sequences * max_completion_length)   constant normaliser

Gradient accumulation: for ``dapo`` pass ``num_active_tokens`` = the active-token count of the
whole optimizer step (all micro-batches, all ranks); for ``dr_grpo`` pass ``num_sequences`` = the
step's number of completions. Summing the micro-batch losses then gives exactly the whole batch's
loss and gradient. ``grpo`` and ``bnpo`` are means over their own call by definition; average
them over micro-batches instead (equal only when the micro-batches have equal normalisers).

Padding (mask 0) never reaches the loss or the gradient, even where logp holds NaN or inf:
values are selected with ``torch.where`` before any arithmetic, never multiplied by the mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from grpokit.core.kl import k3

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "ImportanceSamplingLevel",
    "LOSS_AGGREGATIONS",
    "LossAggregation",
    "LossInputs",
    "LossType",
    "PolicyLoss",
    "PolicyLossOutput",
    "masked_mean",
    "policy_loss",
]

LossType = Literal["grpo", "bnpo", "dapo", "dr_grpo"]
ImportanceSamplingLevel = Literal["token", "sequence"]


@dataclass(frozen=True)
class PolicyLossOutput:
    """What ``policy_loss`` returns. All metrics are detached 0-d tensors (no host sync).

    loss: scalar with gradient.
    clip_ratio_low: share of active tokens with ratio < 1 - epsilon_low and A < 0 (clipped low).
    clip_ratio_high: share of active tokens with ratio > 1 + epsilon_high and A > 0 (clipped high).
    clip_ratio_region: share of active tokens clipped on either side.
    kl: mean k3(logp, ref_logp) over active tokens, or None when no ref_logp was given.
    """

    loss: Tensor
    clip_ratio_low: Tensor
    clip_ratio_high: Tensor
    clip_ratio_region: Tensor
    kl: Tensor | None


class Reduce(Protocol):
    """(B, T) per-token losses (0 on padding), (B, T) float mask -> scalar loss."""

    def __call__(
        self,
        per_token: Tensor,
        mask: Tensor,
        *,
        num_active_tokens: Tensor | float | None,
        num_sequences: int | None,
        max_completion_length: int | None,
    ) -> Tensor: ...


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over entries where ``mask`` is true. (B, T), (B, T) -> scalar.

    Non-finite values under mask 0 are ignored; an all-zero mask gives 0.
    """
    active = mask != 0
    picked = torch.where(active, values, torch.zeros_like(values))
    return picked.sum() / active.sum().clamp(min=1).to(picked.dtype)


def _aggregate_grpo(
    per_token: Tensor,
    mask: Tensor,
    *,
    num_active_tokens: Tensor | float | None,
    num_sequences: int | None,
    max_completion_length: int | None,
) -> Tensor:
    """mean_i(sum_t l / |o_i|): every sequence weighs the same, whatever its length."""
    per_sequence = per_token.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
    return per_sequence.mean()


def _aggregate_bnpo(
    per_token: Tensor,
    mask: Tensor,
    *,
    num_active_tokens: Tensor | float | None,
    num_sequences: int | None,
    max_completion_length: int | None,
) -> Tensor:
    """sum l / (active tokens of this call)."""
    return per_token.sum() / mask.sum().clamp(min=1.0)


def _aggregate_dapo(
    per_token: Tensor,
    mask: Tensor,
    *,
    num_active_tokens: Tensor | float | None,
    num_sequences: int | None,
    max_completion_length: int | None,
) -> Tensor:
    """sum l / (active tokens of the optimizer step; this call's count by default)."""
    if num_active_tokens is None:
        normaliser = mask.sum()
    else:
        normaliser = torch.as_tensor(num_active_tokens, dtype=per_token.dtype)
        normaliser = normaliser.to(per_token.device)
    return per_token.sum() / normaliser.clamp(min=1.0)


def _aggregate_dr_grpo(
    per_token: Tensor,
    mask: Tensor,
    *,
    num_active_tokens: Tensor | float | None,
    num_sequences: int | None,
    max_completion_length: int | None,
) -> Tensor:
    """sum l / (num_sequences * max_completion_length): no dependence on lengths at all."""
    if max_completion_length is None:
        raise ValueError(
            "loss_type='dr_grpo' needs max_completion_length (its normaliser is "
            "num_sequences * max_completion_length); pass the generation limit"
        )
    sequences = per_token.shape[0] if num_sequences is None else num_sequences
    return per_token.sum() / float(sequences * max_completion_length)


@dataclass(frozen=True)
class LossAggregation:
    """One ``loss_type``: how masked per-token losses become a scalar, and how the scalars of a
    step's micro-batches add up to the step's loss.

    step_normalised: the reduction divides by step-wide counts (``num_active_tokens``,
        ``num_sequences``), so the micro-batch losses simply sum to the step's loss (weight 1).
        Otherwise it is a mean over its own call, and a micro-batch of r of the step's N
        sequences weighs r / N.
    """

    reduce: Reduce
    step_normalised: bool

    def __call__(
        self,
        per_token: Tensor,
        mask: Tensor,
        *,
        num_active_tokens: Tensor | float | None,
        num_sequences: int | None,
        max_completion_length: int | None,
    ) -> Tensor:
        return self.reduce(
            per_token,
            mask,
            num_active_tokens=num_active_tokens,
            num_sequences=num_sequences,
            max_completion_length=max_completion_length,
        )

    def micro_batch_weight(self, rows: int, num_sequences: int) -> float:
        """The weight of a micro-batch of ``rows`` sequences in a step of ``num_sequences``."""
        return 1.0 if self.step_normalised else rows / num_sequences


LOSS_AGGREGATIONS: dict[str, LossAggregation] = {
    "grpo": LossAggregation(_aggregate_grpo, step_normalised=False),
    "bnpo": LossAggregation(_aggregate_bnpo, step_normalised=False),
    "dapo": LossAggregation(_aggregate_dapo, step_normalised=True),
    "dr_grpo": LossAggregation(_aggregate_dr_grpo, step_normalised=True),
}
"""loss_type -> aggregation of masked per-token losses into the scalar loss."""


def _log_weights_token(logp: Tensor, old_logp: Tensor, active: Tensor) -> Tensor:
    """log w_{i,t} = logp - old_logp. (B, T) each -> (B, T); inputs already 0 on padding."""
    return logp - old_logp


def _log_weights_sequence(logp: Tensor, old_logp: Tensor, active: Tensor) -> Tensor:
    """GSPO-token: value log s_i = mean over valid t of (logp - old_logp) at every token.

    (B, T) each -> (B, T). The gradient reaching token t is that of logp_t alone
    (sg[log s_i] + logp_t - sg[logp_t]), so each token gets s_i * grad logp_t. With an advantage
    that is constant within a sequence this equals the gradient of the sequence-level objective.
    """
    count = active.sum(dim=-1, keepdim=True).clamp(min=1).to(logp.dtype)
    log_s = ((logp - old_logp).sum(dim=-1, keepdim=True) / count).detach()
    return log_s + (logp - logp.detach())


IMPORTANCE_SAMPLING_LEVELS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "token": _log_weights_token,
    "sequence": _log_weights_sequence,
}
"""importance_sampling_level -> (logp, old_logp, active) -> log importance weights (B, T)."""


def _check_shapes(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None,
) -> None:
    if logp.ndim != 2:
        raise ValueError(f"logp must be (B, T), got shape {tuple(logp.shape)}")
    if logp.shape[0] < 1:
        raise ValueError("logp must hold at least one sequence (B >= 1)")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be a floating tensor, got {logp.dtype}")
    expected = tuple(logp.shape)
    for name, other in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp)):
        if other is not None and tuple(other.shape) != expected:
            raise ValueError(
                f"{name} has shape {tuple(other.shape)} but logp has shape {expected}; "
                "they must match"
            )
    if tuple(advantages.shape) != (expected[0],):
        raise ValueError(
            f"advantages must be (B,) = ({expected[0]},) (one per sequence), got shape "
            f"{tuple(advantages.shape)}"
        )


def _check_hyperparameters(
    epsilon_low: float,
    epsilon_high: float,
    beta: float,
    ref_logp: Tensor | None,
    delta: float | None,
    max_completion_length: int | None,
    num_active_tokens: Tensor | float | None,
    num_sequences: int | None,
) -> None:
    if not epsilon_low >= 0.0:
        raise ValueError(f"epsilon_low must be >= 0, got {epsilon_low!r}")
    if not epsilon_high >= 0.0:
        raise ValueError(f"epsilon_high must be >= 0, got {epsilon_high!r}")
    if not beta >= 0.0:
        raise ValueError(f"beta must be >= 0, got {beta!r}")
    if beta > 0.0 and ref_logp is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logp (the reference model's log-probs)")
    if delta is not None and not delta > 1.0 + epsilon_high:
        raise ValueError(
            f"delta must be > 1 + epsilon_high = {1.0 + epsilon_high}, got {delta!r}; "
            "it caps the unclipped ratio above the clip range"
        )
    if max_completion_length is not None and max_completion_length < 1:
        raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length!r}")
    if isinstance(num_active_tokens, (int, float)) and not num_active_tokens > 0:
        raise ValueError(f"num_active_tokens must be > 0, got {num_active_tokens!r}")
    if num_sequences is not None and num_sequences < 1:
        raise ValueError(f"num_sequences must be >= 1, got {num_sequences!r}")


def policy_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: str,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    importance_sampling_level: str = "token",
    max_completion_length: int | None = None,
    num_active_tokens: Tensor | float | None = None,
    num_sequences: int | None = None,
    delta: float | None = None,
) -> PolicyLossOutput:
    """Clipped surrogate loss with optional k3 KL penalty, aggregated by ``loss_type``.

    logp: (B, T) log-probs of the sampled tokens under the policy being trained (with grad).
    old_logp: (B, T) under the policy that generated them; None means logp.detach() (one
        optimizer step per generation, num_iterations = 1).
    advantages: (B,) one per completion. mask: (B, T), nonzero/True on tokens that count.
    ref_logp: (B, T) under the frozen reference; needed when beta > 0, and if given the ``kl``
        metric is reported even when beta = 0.
    old_logp, advantages and ref_logp are treated as constants (detached).
    epsilon_high defaults to epsilon_low. delta (> 1 + epsilon_high) caps the ratio in the
    unclipped term (two-sided clipping), so a large ratio on a negative advantage is bounded.
    num_active_tokens (dapo) / num_sequences (dr_grpo) default to this call's counts; see the
    module docstring for gradient accumulation.
    """
    aggregate = LOSS_AGGREGATIONS.get(loss_type)
    if aggregate is None:
        raise ValueError(
            f"unknown loss_type {loss_type!r}; choose one of {sorted(LOSS_AGGREGATIONS)}"
        )
    log_weights = IMPORTANCE_SAMPLING_LEVELS.get(importance_sampling_level)
    if log_weights is None:
        raise ValueError(
            f"unknown importance_sampling_level {importance_sampling_level!r}; choose one of "
            f"{sorted(IMPORTANCE_SAMPLING_LEVELS)}"
        )
    eps_high = epsilon_low if epsilon_high is None else epsilon_high
    _check_hyperparameters(
        epsilon_low,
        eps_high,
        beta,
        ref_logp,
        delta,
        max_completion_length,
        num_active_tokens,
        num_sequences,
    )
    _check_shapes(logp, old_logp, advantages, mask, ref_logp)

    active = mask != 0
    zeros = torch.zeros_like(logp)
    logp_safe = torch.where(active, logp, zeros)
    old = logp.detach() if old_logp is None else old_logp.detach().to(logp.dtype)
    old_safe = torch.where(active, old, zeros)

    ratio = torch.exp(log_weights(logp_safe, old_safe, active))
    adv = advantages.detach().to(logp.dtype).unsqueeze(1)
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + eps_high)
    unclipped = ratio if delta is None else torch.clamp(ratio, max=delta)
    per_token = -torch.min(unclipped * adv, clipped * adv)

    kl: Tensor | None = None
    if ref_logp is not None:
        ref_safe = torch.where(active, ref_logp.detach().to(logp.dtype), zeros)
        kl_per_token = k3(logp_safe, ref_safe)
        kl = masked_mean(kl_per_token.detach(), active)
        if beta > 0.0:
            per_token = per_token + beta * kl_per_token

    per_token = torch.where(active, per_token, zeros)
    loss = aggregate(
        per_token,
        active.to(logp.dtype),
        num_active_tokens=num_active_tokens,
        num_sequences=num_sequences,
        max_completion_length=max_completion_length,
    )

    ratio_value = ratio.detach()
    is_low = (ratio_value < 1.0 - epsilon_low) & (adv < 0)
    is_high = (ratio_value > 1.0 + eps_high) & (adv > 0)
    return PolicyLossOutput(
        loss=loss,
        clip_ratio_low=masked_mean(is_low.to(logp.dtype), active),
        clip_ratio_high=masked_mean(is_high.to(logp.dtype), active),
        clip_ratio_region=masked_mean((is_low | is_high).to(logp.dtype), active),
        kl=kl,
    )


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch's per-token tensors and the counts of the whole optimizer step.

    logp, old_logp, ref_logp, mask: (B, T); advantages: (B,). old_logp None means one
    optimizer step per generation (ratio 1 in value); ref_logp None without a KL term.
    num_active_tokens / num_sequences: the step's active tokens and completions over all
    micro-batches and processes (see the module docstring).
    """

    logp: Tensor
    old_logp: Tensor | None
    advantages: Tensor
    mask: Tensor
    ref_logp: Tensor | None
    num_active_tokens: Tensor | float
    num_sequences: int


@dataclass(frozen=True)
class PolicyLoss:
    """The loss of a run: :func:`policy_loss` with its hyperparameters bound (TRL's names).

    A trainer calls it on each micro-batch's :class:`LossInputs` and scales the result by
    :meth:`micro_batch_weight`; it needs to know nothing else about the loss type.
    """

    loss_type: str
    epsilon_low: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    importance_sampling_level: str = "token"
    max_completion_length: int | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_AGGREGATIONS:
            raise ValueError(
                f"unknown loss_type {self.loss_type!r}; choose one of {sorted(LOSS_AGGREGATIONS)}"
            )

    @property
    def needs_reference(self) -> bool:
        """Whether the reference model's log-probs enter the loss (beta > 0)."""
        return self.beta > 0

    def __call__(self, inputs: LossInputs) -> PolicyLossOutput:
        return policy_loss(
            inputs.logp,
            inputs.old_logp,
            inputs.advantages,
            inputs.mask,
            loss_type=self.loss_type,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            beta=self.beta,
            ref_logp=inputs.ref_logp,
            importance_sampling_level=self.importance_sampling_level,
            max_completion_length=self.max_completion_length,
            num_active_tokens=inputs.num_active_tokens,
            num_sequences=inputs.num_sequences,
            delta=self.delta,
        )

    def micro_batch_weight(self, rows: int, num_sequences: int) -> float:
        """The factor that makes a micro-batch's loss its share of the step's loss."""
        return LOSS_AGGREGATIONS[self.loss_type].micro_batch_weight(rows, num_sequences)
