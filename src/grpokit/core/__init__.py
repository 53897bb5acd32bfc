"""Pure torch math of GRPO: advantages, KL estimators, policy losses, log-probs, top-k / top-p
truncation, theory, stats.

Nothing here reads files or config objects; every hyperparameter is a keyword argument.
"""

from __future__ import annotations

from grpokit.core.advantages import (
    ADVANTAGE_ESTIMATORS,
    MULTI_OBJECTIVE_AGGREGATIONS,
    REWARD_SCALES,
    compute_advantages,
    group_advantages,
    normalize_then_sum,
    reward_zero_std_mask,
    rewards_zero_std_mask,
)
from grpokit.core.kl import KL_ESTIMATORS, k1, k2, k3
from grpokit.core.logprobs import entropy_from_logits, head_logprobs, selective_log_softmax
from grpokit.core.losses import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    LossInputs,
    LossOutput,
    LossSettings,
    masked_mean,
    policy_loss,
    reduce,
)
from grpokit.core.stats import paired_difference, pass_at_k, wilson_interval, zero_variance_share
from grpokit.core.theory import FixedPoint, fixed_point, fixed_points, h, h_prime, iterate
from grpokit.core.truncation import kept_tokens, truncate_logits, truncated_log_softmax

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_TYPES",
    "MULTI_OBJECTIVE_AGGREGATIONS",
    "REWARD_SCALES",
    "FixedPoint",
    "LossInputs",
    "LossOutput",
    "LossSettings",
    "compute_advantages",
    "entropy_from_logits",
    "head_logprobs",
    "fixed_point",
    "fixed_points",
    "group_advantages",
    "h",
    "h_prime",
    "iterate",
    "k1",
    "k2",
    "k3",
    "kept_tokens",
    "masked_mean",
    "normalize_then_sum",
    "pass_at_k",
    "paired_difference",
    "policy_loss",
    "reduce",
    "reward_zero_std_mask",
    "rewards_zero_std_mask",
    "selective_log_softmax",
    "truncate_logits",
    "truncated_log_softmax",
    "wilson_interval",
    "zero_variance_share",
]
