"""Group-relative advantages (docs/math.md section 1) and the zero-variance group mask.

Rewards arrive as one float tensor of shape (B,), laid out group by group: rows
``[g * group_size, (g + 1) * group_size)`` are the completions of prompt ``g``. A NaN marks a row
that no reward function applied to (every function returned None); such a row is left out of its
group's statistics and gets advantage 0.

An advantage is computed in two steps, each chosen by name from a registry:

1. the *estimator* centres each reward on a baseline built from its group
   (``"grpo"``: the group mean, ``"rloo"``: the mean of the other members);
2. the *scale* divides the centred values by a spread (``"group"``: the group's std,
   ``"batch"``: the whole batch's std, ``"none"``: no division).

Standard deviations are Bessel-corrected (``unbiased=True``), as TRL computes them.

Several rewards are combined into one advantage in one of two ways (TRL's
``multi_objective_aggregation``, chosen by name from :data:`MULTI_OBJECTIVE_AGGREGATIONS`):

- ``"sum_then_normalize"``: the weighted sum of the rewards is the reward, and the steps above
  give its advantage (TRL's default);
- ``"normalize_then_sum"`` (GDPO): each reward gets its own advantage from the steps above, the
  weighted sum of those is divided by its std over the batch (:func:`normalize_then_sum`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from grpokit.core.names import MultiObjectiveAggregation

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "Aggregation",
    "MULTI_OBJECTIVE_AGGREGATIONS",
    "MultiObjectiveAggregation",
    "REWARD_SCALES",
    "RewardScale",
    "compute_advantages",
    "group_advantages",
    "normalize_then_sum",
    "reward_zero_std_mask",
    "rewards_zero_std_mask",
]

AdvantageEstimator = Literal["grpo", "rloo"]
RewardScale = Literal["group", "batch", "none"]

# (grouped rewards (N, G) with NaN where invalid, valid (N, G) bool) -> centred values (N, G), 0
# where invalid.
CentreFn = Callable[[Tensor, Tensor], Tensor]
# (centred (N, G), grouped rewards (N, G), valid (N, G), eps) -> advantages (N, G).
ScaleFn = Callable[[Tensor, Tensor, Tensor, float], Tensor]


def _group(rewards: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Check the layout and reshape.

    rewards: (B,) float, B = N * group_size. Returns grouped rewards (N, G) and valid (N, G) bool.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    if rewards.ndim != 1:
        raise ValueError(
            f"rewards must be a 1-D tensor (B,) laid out group by group, got shape "
            f"{tuple(rewards.shape)}"
        )
    if not rewards.is_floating_point():
        raise ValueError(
            f"rewards must be a floating tensor (NaN marks a missing reward), got {rewards.dtype}"
        )
    if rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"group_size={group_size} does not divide the number of rewards B={rewards.shape[0]}; "
            "B must be (number of prompts) x group_size"
        )
    if bool(torch.isinf(rewards).any()):
        raise ValueError("rewards contain +/-inf; a reward must be finite (or NaN for 'none')")
    grouped = rewards.view(-1, group_size)
    return grouped, ~torch.isnan(grouped)


def _masked_mean_std(values: Tensor, valid: Tensor, dim: int | None) -> tuple[Tensor, Tensor]:
    """Mean and Bessel-corrected std of the valid entries.

    values, valid: same shape. dim None reduces everything (scalars), else keeps ``dim`` as size 1.
    Fewer than two valid entries give std 0: such a set carries no spread to divide by.
    """
    zeros = torch.zeros_like(values)
    filled = torch.where(valid, values, zeros)
    if dim is None:
        count = valid.sum().to(values.dtype)
        total = filled.sum()
    else:
        count = valid.sum(dim=dim, keepdim=True).to(values.dtype)
        total = filled.sum(dim=dim, keepdim=True)
    mean = total / count.clamp(min=1.0)
    squared = torch.where(valid, (values - mean) ** 2, zeros)
    sq_sum = squared.sum() if dim is None else squared.sum(dim=dim, keepdim=True)
    var = sq_sum / (count - 1.0).clamp(min=1.0)
    std = torch.where(count > 1.0, var.sqrt(), torch.zeros_like(var))
    return mean, std


def _centre_grpo(grouped: Tensor, valid: Tensor) -> Tensor:
    """r_i - mean of the group's valid rewards. (N, G) -> (N, G)."""
    mean, _ = _masked_mean_std(grouped, valid, dim=1)
    return torch.where(valid, grouped - mean, torch.zeros_like(grouped))


def _centre_rloo(grouped: Tensor, valid: Tensor) -> Tensor:
    """r_i - mean of the *other* valid rewards of the group (leave-one-out). (N, G) -> (N, G).

    A row that is alone in its group (one valid reward) has no baseline and gets 0.
    """
    zeros = torch.zeros_like(grouped)
    filled = torch.where(valid, grouped, zeros)
    count = valid.sum(dim=1, keepdim=True).to(grouped.dtype)
    others = (filled.sum(dim=1, keepdim=True) - filled) / (count - 1.0).clamp(min=1.0)
    has_others = valid & (count > 1.0)
    return torch.where(has_others, grouped - others, zeros)


def _divide(centred: Tensor, spread: Tensor) -> Tensor:
    """centred / spread, with 0 where spread is 0.

    A zero spread (possible only with eps = 0) means every valid reward is equal, so the
    centred value is 0 as well and the honest advantage is 0, not 0/0 = NaN.
    """
    safe = torch.where(spread > 0, spread, torch.ones_like(spread))
    return torch.where(spread > 0, centred / safe, torch.zeros_like(centred))


def _scale_group(centred: Tensor, grouped: Tensor, valid: Tensor, eps: float) -> Tensor:
    """Divide by the group's std (+ eps). (N, G) -> (N, G)."""
    _, std = _masked_mean_std(grouped, valid, dim=1)
    return _divide(centred, std + eps)


def _scale_batch(centred: Tensor, grouped: Tensor, valid: Tensor, eps: float) -> Tensor:
    """Divide by the std of all valid rewards of the batch (+ eps), around the batch mean."""
    _, std = _masked_mean_std(grouped, valid, dim=None)
    return _divide(centred, std + eps)


def _scale_none(centred: Tensor, grouped: Tensor, valid: Tensor, eps: float) -> Tensor:
    """No division (Dr. GRPO)."""
    return centred


ADVANTAGE_ESTIMATORS: dict[str, CentreFn] = {"grpo": _centre_grpo, "rloo": _centre_rloo}
"""Estimator name -> baseline-centring function on grouped rewards."""

REWARD_SCALES: dict[str, ScaleFn] = {
    "group": _scale_group,
    "batch": _scale_batch,
    "none": _scale_none,
}
"""Scale name -> function dividing centred rewards by a spread."""


def compute_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    estimator: str = "grpo",
    scale: str = "group",
    eps: float = 1e-4,
) -> Tensor:
    """Advantages for rewards laid out group by group.

    rewards: (B,) float, NaN where no reward applies; B = number of groups x group_size.
    Returns advantages (B,) in the rewards' dtype; NaN rows get 0 and do not enter their group's
    mean or std. ``eps`` is added to the std before dividing (TRL 1e-4; verl 1e-6).
    """
    centre = ADVANTAGE_ESTIMATORS.get(estimator)
    if centre is None:
        raise ValueError(
            f"unknown estimator {estimator!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}"
        )
    scale_fn = REWARD_SCALES.get(scale)
    if scale_fn is None:
        raise ValueError(f"unknown scale {scale!r}; choose one of {sorted(REWARD_SCALES)}")
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    grouped, valid = _group(rewards, group_size)
    advantages = scale_fn(centre(grouped, valid), grouped, valid, eps)
    # Invalid rows are already 0 after centring; this keeps them 0 whatever a scale does.
    advantages = torch.where(valid, advantages, torch.zeros_like(advantages))
    return advantages.reshape(-1)


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    scale: str = "group",
    eps: float = 1e-4,
) -> Tensor:
    """GRPO advantages A_i = (r_i - group mean) / (std + eps) (DeepSeekMath sec. 4.1.2).

    rewards: (B,) float, NaN where no reward applies. Returns (B,). Same as
    ``compute_advantages(..., estimator="grpo")``.
    """
    return compute_advantages(rewards, group_size, estimator="grpo", scale=scale, eps=eps)


def reward_zero_std_mask(rewards: Tensor, group_size: int, *, atol: float = 1e-8) -> Tensor:
    """Groups with no learning signal: their valid rewards are all equal (within ``atol``).

    rewards: (B,) float, NaN where no reward applies. Returns (B // group_size,) bool. A group
    with fewer than two valid rewards counts as zero-std too: it has nothing to compare.
    Its mean over groups is the metric ``frac_reward_zero_std``; DAPO dynamic sampling drops
    these groups.
    """
    grouped, valid = _group(rewards, group_size)
    high = torch.where(valid, grouped, torch.full_like(grouped, -torch.inf)).amax(dim=1)
    low = torch.where(valid, grouped, torch.full_like(grouped, torch.inf)).amin(dim=1)
    few = valid.sum(dim=1) < 2
    return few | ((high - low) <= atol)


def rewards_zero_std_mask(per_function: Tensor, group_size: int, *, atol: float = 1e-8) -> Tensor:
    """Groups in which every reward is flat: each column's valid values are all equal.

    per_function: (B, F) float, NaN where a reward does not apply. Returns (B // group_size,)
    bool. Under ``normalize_then_sum`` these groups, and only these, get advantage 0 whatever the
    weights; a group whose weighted sum is flat while its rewards are not can still have a signal.
    """
    if per_function.ndim != 2:
        raise ValueError(f"per_function must be (B, F), got shape {tuple(per_function.shape)}")
    flat = [reward_zero_std_mask(column, group_size, atol=atol) for column in per_function.T]
    if not flat:
        return torch.ones(per_function.shape[0] // group_size, dtype=torch.bool)
    return torch.stack(flat).all(dim=0)


def normalize_then_sum(
    per_function: Tensor,
    weights: Tensor,
    group_size: int,
    *,
    estimator: str = "grpo",
    scale: str = "group",
    eps: float = 1e-4,
) -> Tensor:
    """GDPO advantages (Liu et al. 2026, arXiv 2601.05242; TRL ``normalize_then_sum``):

        A_{i,k} = advantage of reward k alone (estimator and scale as in compute_advantages)
        S_i     = sum_k w_k * A_{i,k}          (a None of reward k adds 0)
        A_i     = S_i / (std(S over the batch's scored rows) + eps)

    per_function: (B, F) float, NaN where reward k returned None for row i (or a closed gate
    whose ``otherwise`` is None); weights: (F,). Returns (B,) in per_function's dtype.

    A None is left out of that reward's group mean and std (compute_advantages' rule for NaN) and
    adds 0 to the row's sum, as TRL's nanmean / nanstd / nansum do. A row with every reward None
    is out of the batch std and gets 0. TRL also subtracts the batch mean of S; it is 0 here by
    construction (each reward's centred values sum to 0 within each group), so only the division
    is done and a group whose every reward is flat keeps advantage exactly 0.
    """
    if per_function.ndim != 2:
        raise ValueError(f"per_function must be (B, F), got shape {tuple(per_function.shape)}")
    if weights.shape != (per_function.shape[1],):
        raise ValueError(
            f"weights must be ({per_function.shape[1]},), one per reward, got "
            f"{tuple(weights.shape)}"
        )
    summed = torch.zeros(per_function.shape[0], dtype=per_function.dtype)
    for column, weight in zip(per_function.T, weights.to(per_function.dtype), strict=True):
        summed = summed + weight * compute_advantages(
            column, group_size, estimator=estimator, scale=scale, eps=eps
        )
    scored = ~torch.isnan(per_function).all(dim=1)
    _, std = _masked_mean_std(summed, scored, dim=None)
    return torch.where(scored, _divide(summed, std + eps), torch.zeros_like(summed))


@dataclass(frozen=True)
class Aggregation:
    """How several rewards become one advantage per completion, and which groups that leaves
    without a signal (DAPO dynamic sampling drops those)."""

    advantages: Callable[..., Tensor]
    """(total (B,), per_function (B, F), weights (F,), group_size, *, estimator, scale, eps) ->
    advantages (B,). ``total`` is the weighted sum of the rewards (NaN where all are None)."""
    no_signal: Callable[[Tensor, Tensor, int], Tensor]
    """(total (B,), per_function (B, F), group_size) -> (B // group_size,) bool."""


def _sum_then_normalize(
    total: Tensor,
    per_function: Tensor,
    weights: Tensor,
    group_size: int,
    *,
    estimator: str = "grpo",
    scale: str = "group",
    eps: float = 1e-4,
) -> Tensor:
    return compute_advantages(total, group_size, estimator=estimator, scale=scale, eps=eps)


def _normalize_then_sum(
    total: Tensor,
    per_function: Tensor,
    weights: Tensor,
    group_size: int,
    *,
    estimator: str = "grpo",
    scale: str = "group",
    eps: float = 1e-4,
) -> Tensor:
    return normalize_then_sum(
        per_function, weights, group_size, estimator=estimator, scale=scale, eps=eps
    )


MULTI_OBJECTIVE_AGGREGATIONS: dict[str, Aggregation] = {
    "sum_then_normalize": Aggregation(
        _sum_then_normalize, lambda total, per_function, g: reward_zero_std_mask(total, g)
    ),
    "normalize_then_sum": Aggregation(
        _normalize_then_sum, lambda total, per_function, g: rewards_zero_std_mask(per_function, g)
    ),
}
"""TRL's multi_objective_aggregation name -> how rewards become advantages."""
