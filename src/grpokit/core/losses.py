"""Policy losses: a surrogate per token, an optional k3 KL penalty, one reduction (docs/math.md 2-3).

A ``loss_type`` is two registered parts (:data:`LOSS_TYPES`):

- a **surrogate**, the per-token policy-gradient term built from the importance weight
  w_{i,t} = exp(logp - old_logp) (or GSPO's sequence weight s_i) and the advantage A_i:

      clip   -min(min(w, delta) * A, clip(w, 1 - eps_low, 1 + eps_high) * A)      PPO / GRPO / DAPO
      cispo  -sg(min(w, eps_high)) * A * logp                                      MiniMax-M1 CISPO
      sapo   -f(w) * A,  f(w) = sigmoid(tau * (w - 1)) * 4 / tau,                  SAPO (soft gate)
             tau = sapo_temperature_pos where A > 0, sapo_temperature_neg elsewhere

  each returning its per-token losses and its per-token metric values;
- a **normaliser**, how the masked per-token losses l (plus beta * k3) become a scalar
  (:func:`reduce`):

      sequence     mean_i( sum_t l M / sum_t M )                 grpo, sapo
      tokens       sum l M / sum M  (this call's tokens)         bnpo
      step_tokens  sum l M / (active tokens of the step)         dapo, cispo
      fixed        sum l M / (num_sequences * max_completion_length)   dr_grpo

When the sampler is not the trainer (vLLM, another dtype or kernel), the tokens were drawn from
pi_sampler, not from the trainer's pi_old. With the sampler's log-probs the loss logs the gap
(``mismatch/*``) and, with a :class:`MismatchCorrection`, multiplies each token's policy term by a
truncated importance weight rho = pi_old / pi_sampler (per token, or the product over the
sequence), clipped to clip_max or zeroed outside [clip_min, clip_max] (TRL's
vllm_importance_sampling_* modes; verl's rollout_is). The KL term is not reweighted.

Off-policy stabilisers (DeepSeek-V3.2, arXiv 2512.02556; TRL's names): ``off_policy_mask_threshold``
drops the policy term of each completion with a negative advantage whose mean log-ratio
log pi_behaviour - log pi_theta exceeds the threshold (:func:`off_policy_sequence_mask`), and
``use_bias_correction_kl`` multiplies the k3 KL term by the importance weight w, so that samples
from pi_old estimate KL(pi_theta || pi_ref) and its gradient without bias.

A new loss is a surrogate function and one line in :data:`LOSS_TYPES`; the trainer asks the loss
what it needs (:attr:`PolicyLoss.needs`) and weights micro-batches as it says.

Gradient accumulation: ``step_tokens`` and ``fixed`` divide by counts of the whole optimizer step
(:class:`StepCounts`), so the micro-batch losses simply sum to the step's loss; ``sequence`` and
``tokens`` are means over their own call, weighted by rows (equal only with equal normalisers).

Padding (mask 0) never reaches the loss or the gradient, even where logp holds NaN or inf: values
are selected with ``torch.where`` before any arithmetic, never multiplied by the mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from grpokit.core.kl import k3
from grpokit.core.names import LossTypeName, MismatchMode

__all__ = [
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "LossInputs",
    "LossNeeds",
    "LossOutput",
    "LossSettings",
    "LossTypeName",
    "MismatchCorrection",
    "MismatchMode",
    "Normaliser",
    "PolicyLoss",
    "StepCounts",
    "Surrogate",
    "SurrogateInputs",
    "masked_mean",
    "micro_batch_weight",
    "mismatch_weights",
    "off_policy_sequence_mask",
    "policy_loss",
    "reduce",
]

Normaliser = Literal["sequence", "tokens", "step_tokens", "fixed"]


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over entries where ``mask`` is true. (B, T), (B, T) -> scalar.

    Non-finite values under mask 0 are ignored; an all-zero mask gives 0.
    """
    active = mask != 0
    picked = torch.where(active, values, torch.zeros_like(values))
    return picked.sum() / active.sum().clamp(min=1).to(picked.dtype)


# ---- reduction -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCounts:
    """Counts of the whole optimizer step (all micro-batches, all processes).

    num_active_tokens: its active completion tokens (``step_tokens``); None means this call's.
    num_sequences: its completions (``fixed``); None means this call's rows.
    max_completion_length: the generation limit (``fixed`` needs it).
    """

    num_active_tokens: Tensor | float | None = None
    num_sequences: int | None = None
    max_completion_length: int | None = None


def reduce(per_token: Tensor, mask: Tensor, normaliser: Normaliser, counts: StepCounts) -> Tensor:
    """Masked per-token losses -> the scalar loss. (B, T) losses (0 on padding), (B, T) float mask.

    See the module docstring for each normaliser's formula.
    """
    if normaliser == "sequence":
        return (per_token.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)).mean()
    if normaliser == "tokens":
        return per_token.sum() / mask.sum().clamp(min=1.0)
    if normaliser == "step_tokens":
        if counts.num_active_tokens is None:
            return per_token.sum() / mask.sum().clamp(min=1.0)
        tokens = torch.as_tensor(counts.num_active_tokens, dtype=per_token.dtype)
        return per_token.sum() / tokens.to(per_token.device).clamp(min=1.0)
    if counts.max_completion_length is None:
        raise ValueError(
            "loss_type='dr_grpo' needs max_completion_length: its fixed normaliser is "
            "num_sequences * max_completion_length; pass the generation limit"
        )
    sequences = per_token.shape[0] if counts.num_sequences is None else counts.num_sequences
    return per_token.sum() / float(sequences * counts.max_completion_length)


def micro_batch_weight(normaliser: Normaliser, rows: int, num_sequences: int) -> float:
    """The factor that makes a micro-batch of ``rows`` of the step's ``num_sequences`` its share
    of the step's loss: 1 where the reduction already divides by step-wide counts."""
    return 1.0 if normaliser in ("step_tokens", "fixed") else rows / num_sequences


# ---- importance weights --------------------------------------------------------------------------


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


# ---- sampler / trainer mismatch -------------------------------------------------------------------


@dataclass(frozen=True)
class MismatchCorrection:
    """Truncated importance sampling from the sampler's distribution to the trainer's (TRL's
    ``vllm_importance_sampling_mode`` / ``_clip_min`` / ``_clip_max``).

    mode: ``token_*`` weighs each token by its own ratio, ``sequence_*`` every token of a
    completion by the product of its ratios; ``*_truncate`` clips the weight to
    [clip_min, clip_max], ``*_mask`` sets it to 0 outside that range. clip_min None means 0.
    """

    mode: MismatchMode = "sequence_mask"
    clip_min: float | None = None
    clip_max: float = 3.0

    def __post_init__(self) -> None:
        if not self.clip_max > 0:
            raise ValueError(f"the mismatch clip_max must be > 0, got {self.clip_max!r}")
        if self.clip_min is not None and not 0 <= self.clip_min < self.clip_max:
            raise ValueError(
                f"the mismatch clip_min must be in [0, clip_max = {self.clip_max}), got "
                f"{self.clip_min!r}"
            )


def mismatch_weights(
    old_logp: Tensor, sampler_logp: Tensor, active: Tensor, c: MismatchCorrection
) -> tuple[Tensor, Tensor, Tensor]:
    """Importance weights from the sampler to the trainer. (B, T) each, 0 on padding.

    Returns (weight, ratio, outside): the (B, T) weight each token's policy term is multiplied
    by; the (B, T) ratio pi_old / pi_sampler it comes from (per token, or the sequence's product
    at each of its tokens); and (B, T) bool, where the ratio fell outside [clip_min, clip_max].
    All detached.
    """
    diff = torch.where(
        active, old_logp.detach() - sampler_logp.detach(), torch.zeros_like(old_logp)
    )
    if c.mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True).expand_as(old_logp)
    ratio = torch.exp(diff)
    low = 0.0 if c.clip_min is None else c.clip_min
    outside = ((ratio > c.clip_max) | (ratio < low)) & active
    if c.mode.endswith("truncate"):
        weight = ratio.clamp(min=low, max=c.clip_max)
    else:
        weight = torch.where(outside, torch.zeros_like(ratio), ratio)
    return weight, ratio, outside


# ---- off-policy stabilisers ---------------------------------------------------------------------


def off_policy_sequence_mask(
    advantages: Tensor, logp: Tensor, behaviour_logp: Tensor, active: Tensor, threshold: float
) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, eq. 9; TRL's
    ``off_policy_mask_threshold``). (B, 1) advantages, (B, T) logp / behaviour_logp / bool active
    -> (B, 1) bool, True where the completion's policy term is kept.

    A completion is dropped when its advantage is negative and the mean over its active tokens of
    log pi_behaviour - log pi_theta (a per-sequence estimate of KL(pi_behaviour || pi_theta)) is
    above ``threshold``: pushing down a sample the current policy already finds much less likely
    than the sampler did mostly adds noise. Kept when A >= 0 or the mean <= threshold (TRL's
    rule). Detached; inputs may hold anything on padding.
    """
    diff = torch.where(active, behaviour_logp.detach() - logp.detach(), torch.zeros_like(logp))
    # A token the sampler could not score (NaN) is no evidence of drift (TRL does the same).
    diff = torch.nan_to_num(diff, nan=0.0)
    count = active.sum(dim=-1, keepdim=True).clamp(min=1).to(diff.dtype)
    mean_log_ratio = diff.sum(dim=-1, keepdim=True) / count
    return (advantages.detach() >= 0) | (mean_log_ratio <= threshold)


# ---- surrogates ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossSettings:
    """A loss's hyperparameters (TRL's names). Each surrogate reads the ones it uses.

    epsilon_high defaults to epsilon_low for ``clip``; for ``cispo`` it is the cap on the
    importance weight itself (TRL's meaning; 5.0 in ScaleRL) and must be given, > 1.
    delta (> 1 + epsilon_high) caps the ratio in ``clip``'s unclipped term (two-sided clipping).
    """

    loss_type: str = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    importance_sampling_level: str = "token"
    max_completion_length: int | None = None
    delta: float | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    mismatch: MismatchCorrection | None = None
    """Correct for the sampler's numerics (None: only measure the gap, when its log-probs are
    given)."""
    off_policy_mask_threshold: float | None = None
    """Drop the policy term of negative-advantage completions whose mean log-ratio
    log pi_behaviour - log pi_theta exceeds it (:func:`off_policy_sequence_mask`); None: off."""
    use_bias_correction_kl: bool = False
    """Multiply the k3 KL term by the importance weight w (with its gradient)."""

    @property
    def eps_high(self) -> float:
        return self.epsilon_low if self.epsilon_high is None else self.epsilon_high

    def __post_init__(self) -> None:
        kind = LOSS_TYPES.get(self.loss_type)
        if kind is None:
            raise ValueError(
                f"unknown loss_type {self.loss_type!r}; choose one of {sorted(LOSS_TYPES)}"
            )
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"unknown importance_sampling_level {self.importance_sampling_level!r}; choose "
                f"one of {sorted(IMPORTANCE_SAMPLING_LEVELS)}"
            )
        for name in ("epsilon_low", "epsilon_high", "beta"):
            value = getattr(self, name)
            if value is not None and not value >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if self.delta is not None and not self.delta > 1.0 + self.eps_high:
            raise ValueError(
                f"delta must be > 1 + epsilon_high = {1.0 + self.eps_high}, got {self.delta!r}; "
                "it caps the unclipped ratio above the clip range"
            )
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ValueError(
                f"max_completion_length must be >= 1, got {self.max_completion_length!r}"
            )
        if self.off_policy_mask_threshold is not None and not self.off_policy_mask_threshold >= 0:
            raise ValueError(
                f"off_policy_mask_threshold must be >= 0 (a log-ratio, e.g. 0.5), got "
                f"{self.off_policy_mask_threshold!r}"
            )
        for name in ("sapo_temperature_pos", "sapo_temperature_neg"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if kind.surrogate is cispo_surrogate and not (
            self.epsilon_high is not None and self.epsilon_high > 1.0
        ):
            raise ValueError(
                f"loss_type='cispo' caps the importance weight at epsilon_high, which must be set "
                f"above 1 (5.0 in ScaleRL), got {self.epsilon_high!r}"
            )


@dataclass(frozen=True)
class SurrogateInputs:
    """What a surrogate sees of one micro-batch.

    weight: (B, T) importance weights w (GSPO: s_i at each token), with gradient.
    logp: (B, T) the policy's log-probs of the sampled tokens, 0 on padding, with gradient.
    advantages: (B, 1) detached. active: (B, T) bool, the tokens that count.
    """

    weight: Tensor
    logp: Tensor
    advantages: Tensor
    active: Tensor


Surrogate = Callable[[SurrogateInputs, LossSettings], tuple[Tensor, dict[str, Tensor]]]
"""(inputs, settings) -> per-token losses (B, T), and per-token metric values (B, T) that the
loss averages over the active tokens (e.g. 0/1 clip indicators)."""


def clip_surrogate(x: SurrogateInputs, s: LossSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate: -min(min(w, delta) A, clip(w, 1 - eps_low, 1 + eps_high) A).

    Metrics (TRL's names): the share of tokens clipped low (w < 1 - eps_low with A < 0), high
    (w > 1 + eps_high with A > 0), and either.
    """
    w, adv = x.weight, x.advantages
    clipped = torch.clamp(w, 1.0 - s.epsilon_low, 1.0 + s.eps_high)
    unclipped = w if s.delta is None else torch.clamp(w, max=s.delta)
    per_token = -torch.min(unclipped * adv, clipped * adv)
    value = w.detach()
    low = (value < 1.0 - s.epsilon_low) & (adv < 0)
    high = (value > 1.0 + s.eps_high) & (adv > 0)
    dtype = per_token.dtype
    return per_token, {
        "clip_ratio/low_mean": low.to(dtype),
        "clip_ratio/high_mean": high.to(dtype),
        "clip_ratio/region_mean": (low | high).to(dtype),
    }


def cispo_surrogate(x: SurrogateInputs, s: LossSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(min(w, eps_high)) * A * logp.

    The weight is clipped and detached, never the token: every token keeps a gradient
    min(w, eps_high) * A * grad logp, including the rare ones PPO's clip would silence.
    Metric ``cispo_clip_ratio`` (TRL's name): the share of tokens whose weight hit the cap with
    A > 0.
    """
    capped = torch.clamp(x.weight.detach(), max=s.eps_high)
    per_token = -capped * x.advantages * x.logp
    hit = (x.weight.detach() > s.eps_high) & (x.advantages > 0)
    return per_token, {"cispo_clip_ratio": hit.to(per_token.dtype)}


def sapo_surrogate(x: SurrogateInputs, s: LossSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (Soft Adaptive Policy Optimization, Gao et al. 2025): -f(w) * A, f(w) = sigmoid(tau (w - 1)) 4 / tau.

    A soft trust region: f'(w) = 4 sigmoid'(tau (w - 1)) is 1 at w = 1 (the plain policy
    gradient on-policy) and decays smoothly as w leaves 1, faster for negative advantages
    (tau_neg > tau_pos). Metric ``sapo/gate_mean``: the mean of f'(w), the share of the plain
    gradient that reaches the tokens.
    """
    tau = torch.where(
        x.advantages > 0,
        torch.full_like(x.advantages, s.sapo_temperature_pos),
        torch.full_like(x.advantages, s.sapo_temperature_neg),
    )
    gate = torch.sigmoid(tau * (x.weight - 1.0))
    per_token = -(gate * 4.0 / tau) * x.advantages
    g = gate.detach()
    return per_token, {"sapo/gate_mean": 4.0 * g * (1.0 - g)}


@dataclass(frozen=True)
class LossType:
    """One ``loss_type``: its surrogate and its normaliser."""

    surrogate: Surrogate
    normaliser: Normaliser


LOSS_TYPES: dict[str, LossType] = {
    "grpo": LossType(clip_surrogate, "sequence"),
    "bnpo": LossType(clip_surrogate, "tokens"),
    "dapo": LossType(clip_surrogate, "step_tokens"),
    "dr_grpo": LossType(clip_surrogate, "fixed"),
    # TRL normalises cispo like dapo and sapo like grpo; so does grpokit.
    "cispo": LossType(cispo_surrogate, "step_tokens"),
    "sapo": LossType(sapo_surrogate, "sequence"),
}
"""loss_type -> (surrogate, normaliser). :data:`LossTypeName` lists the same names."""


# ---- the loss ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch's per-token tensors and the counts of the whole optimizer step.

    logp: (B, T) log-probs of the sampled tokens under the policy being trained (with grad).
    old_logp: (B, T) under the policy that generated them; None means logp.detach() (one
        optimizer step per generation: the ratio is 1 in value).
    advantages: (B,) one per completion. mask: (B, T), nonzero/True on tokens that count.
    ref_logp: (B, T) under the frozen reference; needed when beta > 0, and if given the ``kl``
        metric is reported even when beta = 0.
    old_logp, advantages and ref_logp are treated as constants (detached).
    """

    logp: Tensor
    old_logp: Tensor | None
    advantages: Tensor
    mask: Tensor
    ref_logp: Tensor | None = None
    counts: StepCounts = field(default_factory=StepCounts)
    sampler_logp: Tensor | None = None
    """(B, T) the sampler's log-probs of the same tokens (temperature-scaled, as logp): the gap
    is measured, and corrected where the settings say so."""
    kl_logp: Tensor | None = None
    """(B, T) the policy's log-probs for the KL term, with grad, where they differ from logp:
    under top-k / top-p sampling logp (and old_logp, sampler_logp) score the truncated
    distribution, and kl_logp = logp + log S the untruncated one that the reference's log-probs
    score; the kept mass S = exp(kl_logp - logp) is then logged as ``sampling/kept_mass``.
    None: logp."""
    policy_mask: Tensor | None = None
    """(B, T) 0/1 on the tokens whose policy term trains (top_entropy_quantile's high-entropy
    tokens, grpokit.core.entropy); the KL term and the normaliser still count every token of
    ``mask``, as in TRL. None: every token of ``mask``."""


@dataclass(frozen=True)
class LossOutput:
    """loss: scalar with gradient. metrics: detached 0-d tensors, each a mean over this call's
    active tokens (no host sync: the trainer moves them to the host once per optimizer step)."""

    loss: Tensor
    metrics: dict[str, Tensor]


def _check_shapes(x: LossInputs) -> None:
    logp = x.logp
    if logp.ndim != 2:
        raise ValueError(f"logp must be (B, T), got shape {tuple(logp.shape)}")
    if logp.shape[0] < 1:
        raise ValueError("logp must hold at least one sequence (B >= 1)")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be a floating tensor, got {logp.dtype}")
    expected = tuple(logp.shape)
    others = (
        ("old_logp", x.old_logp),
        ("mask", x.mask),
        ("ref_logp", x.ref_logp),
        ("sampler_logp", x.sampler_logp),
        ("kl_logp", x.kl_logp),
        ("policy_mask", x.policy_mask),
    )
    for name, other in others:
        if other is not None and tuple(other.shape) != expected:
            raise ValueError(
                f"{name} has shape {tuple(other.shape)} but logp has shape {expected}; "
                "they must match"
            )
    if tuple(x.advantages.shape) != (expected[0],):
        raise ValueError(
            f"advantages must be (B,) = ({expected[0]},) (one per sequence), got shape "
            f"{tuple(x.advantages.shape)}"
        )
    tokens, sequences = x.counts.num_active_tokens, x.counts.num_sequences
    limit = x.counts.max_completion_length
    if limit is not None and limit < 1:
        raise ValueError(f"max_completion_length must be >= 1, got {limit!r}")
    if isinstance(tokens, (int, float)) and not tokens > 0:
        raise ValueError(f"num_active_tokens must be > 0, got {tokens!r}")
    if sequences is not None and sequences < 1:
        raise ValueError(f"num_sequences must be >= 1, got {sequences!r}")


def policy_loss(x: LossInputs, s: LossSettings) -> LossOutput:
    """The surrogate of ``s.loss_type`` plus beta * k3 towards the reference, reduced to a scalar.

    Pure: shapes as in :class:`LossInputs`; the module docstring has every formula.
    """
    if s.beta > 0.0 and x.ref_logp is None:
        raise ValueError(f"beta={s.beta} > 0 needs ref_logp (the reference model's log-probs)")
    _check_shapes(x)
    kind = LOSS_TYPES[s.loss_type]
    logp = x.logp
    active = x.mask != 0
    zeros = torch.zeros_like(logp)
    logp_safe = torch.where(active, logp, zeros)
    old = logp.detach() if x.old_logp is None else x.old_logp.detach().to(logp.dtype)
    old_safe = torch.where(active, old, zeros)
    log_weights = IMPORTANCE_SAMPLING_LEVELS[s.importance_sampling_level]
    weight = torch.exp(log_weights(logp_safe, old_safe, active))
    adv = x.advantages.detach().to(logp.dtype).unsqueeze(1)
    per_token, per_token_metrics = kind.surrogate(
        SurrogateInputs(weight=weight, logp=logp_safe, advantages=adv, active=active), s
    )
    metrics = {k: masked_mean(v.detach(), active) for k, v in per_token_metrics.items()}
    sampler_safe = None
    if x.sampler_logp is not None:
        sampler_safe = torch.where(active, x.sampler_logp.detach().to(logp.dtype), zeros)
        correction = _mismatch(old_safe, sampler_safe, active, s.mismatch, metrics)
        if correction is not None:
            per_token = per_token * correction
    if x.policy_mask is not None:
        per_token = per_token * x.policy_mask.detach().to(per_token.dtype)
    if s.off_policy_mask_threshold is not None:
        # The sampler's log-probs see both gaps, the updates since generation and the kernels'
        # (TRL prefers vLLM's for the same reason); pi_old where the sampler's are not given.
        behaviour = old_safe if sampler_safe is None else sampler_safe
        keep = off_policy_sequence_mask(
            adv, logp_safe, behaviour, active, s.off_policy_mask_threshold
        )
        per_token = torch.where(keep, per_token, zeros)  # where, not *: a NaN term stays out
        metrics["off_policy_mask/masked_frac"] = masked_mean(
            (~keep).expand_as(active).to(logp.dtype), active
        )
    kl_logp_safe = logp_safe
    if x.kl_logp is not None:
        kl_logp_safe = torch.where(active, x.kl_logp.to(logp.dtype), zeros)
        metrics["sampling/kept_mass"] = masked_mean(
            torch.exp(kl_logp_safe - logp_safe).detach(), active
        )
    if x.ref_logp is not None:
        ref_safe = torch.where(active, x.ref_logp.detach().to(logp.dtype), zeros)
        kl_per_token = k3(kl_logp_safe, ref_safe)
        if s.use_bias_correction_kl:
            # E_old[w k3] = KL(pi_theta || pi_ref), and the gradient of w k3 is
            # w (logp - ref) grad logp: in expectation the gradient of that KL (k3's own is the
            # gradient of KL(pi_ref || pi_theta), grpokit.core.kl).
            kl_per_token = kl_per_token * weight
        metrics["kl"] = masked_mean(kl_per_token.detach(), active)
        if s.beta > 0.0:
            per_token = per_token + s.beta * kl_per_token
    per_token = torch.where(active, per_token, zeros)
    counts = x.counts
    if counts.max_completion_length is None and s.max_completion_length is not None:
        counts = StepCounts(counts.num_active_tokens, counts.num_sequences, s.max_completion_length)
    loss = reduce(per_token, active.to(logp.dtype), kind.normaliser, counts)
    return LossOutput(loss=loss, metrics=metrics)


def _mismatch(
    old: Tensor,
    sampler: Tensor,
    active: Tensor,
    correction: MismatchCorrection | None,
    metrics: dict[str, Tensor],
) -> Tensor | None:
    """The (B, T) weight of each token's policy term, None without a correction; adds the gap's
    metrics: the k3 estimate of KL(pi_sampler || pi_old), the largest ratio, and the share of
    tokens the correction truncated or masked."""
    metrics["mismatch/kl"] = masked_mean(k3(sampler, old), active)
    if correction is None:  # measured only: the per-token ratio, nothing reweighted
        ratio = torch.exp(torch.where(active, old - sampler, torch.zeros_like(old)))
        metrics["mismatch/max_ratio"] = torch.where(active, ratio, torch.zeros_like(ratio)).max()
        return None
    weight, ratio, outside = mismatch_weights(old, sampler, active, correction)
    metrics["mismatch/max_ratio"] = torch.where(active, ratio, torch.zeros_like(ratio)).max()
    kind = "truncated" if correction.mode.endswith("truncate") else "masked"
    metrics[f"mismatch/{kind}_frac"] = masked_mean(outside.to(old.dtype), active)
    return weight


@dataclass(frozen=True)
class LossNeeds:
    """The per-token inputs a loss needs computed before the update.

    old_logp: the generating policy's log-probs, taken once before the first of several
        optimizer steps on one generation (num_iterations > 1); with one step they equal the
        policy's own detached log-probs and cost nothing.
    ref_logp: the reference model's log-probs (beta > 0).
    """

    old_logp: bool
    ref_logp: bool


@dataclass(frozen=True)
class PolicyLoss:
    """The loss of a run: :func:`policy_loss` with its settings bound.

    A trainer asks :attr:`needs` what to compute before the update, calls it on each
    micro-batch's :class:`LossInputs` and scales the result by :meth:`micro_batch_weight`; it
    knows nothing else about the loss type.
    """

    settings: LossSettings
    num_iterations: int = 1
    """Optimizer steps on one generation (mu x steps_per_generation / gradient accumulation)."""

    @property
    def needs(self) -> LossNeeds:
        return LossNeeds(old_logp=self.num_iterations > 1, ref_logp=self.settings.beta > 0)

    def __call__(self, inputs: LossInputs) -> LossOutput:
        return policy_loss(inputs, self.settings)

    def micro_batch_weight(self, rows: int, num_sequences: int) -> float:
        """The factor that makes a micro-batch's loss its share of the step's loss."""
        normaliser = LOSS_TYPES[self.settings.loss_type].normaliser
        return micro_batch_weight(normaliser, rows, num_sequences)
