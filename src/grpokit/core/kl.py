"""Per-token estimators of KL(pi_theta || pi_ref) from tokens sampled by the policy.

Each takes the log-probabilities the policy and the reference give to the sampled tokens, both
(B, T), and returns a per-token estimate (B, T). With r = pi_ref / pi_theta = exp(ref - logp)
(Schulman, "Approximating KL divergence", 2020):

- k1 = -log r = logp - ref. Unbiased for KL(pi_theta || pi_ref), but can be negative and has high
  variance. As a loss its gradient is grad log pi_theta, whose expectation under pi_theta is zero:
  it does not pull the policy towards the reference at all.
- k2 = (log r)^2 / 2. Biased (its expectation is not the KL), low variance, >= 0. As a loss its
  gradient (logp - ref) grad log pi_theta has the expectation of the true gradient of
  KL(pi_theta || pi_ref).
- k3 = r - 1 - log r = exp(ref - logp) - (ref - logp) - 1. Unbiased for KL(pi_theta || pi_ref),
  >= 0 (since e^x >= 1 + x), equal to 0 iff logp == ref, low variance. This is the one GRPO uses
  (DeepSeekMath eq. 4). As a loss its gradient (1 - r) grad log pi_theta has, in expectation, the
  gradient of the *forward* KL(pi_ref || pi_theta), not of the KL it estimates; it still pulls
  towards the reference, which is what the penalty is for.

None of these functions masks padding: callers pass finite values (or mask afterwards with
``torch.where``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["KL_ESTIMATORS", "k1", "k2", "k3"]


def _check(logp: Tensor, ref_logp: Tensor) -> None:
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"logp and ref_logp must have the same shape, got {tuple(logp.shape)} and "
            f"{tuple(ref_logp.shape)}"
        )


def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = logp - ref_logp. (B, T), (B, T) -> (B, T). Unbiased, may be negative."""
    _check(logp, ref_logp)
    return logp - ref_logp


def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = (logp - ref_logp)^2 / 2. (B, T), (B, T) -> (B, T). Biased, >= 0."""
    _check(logp, ref_logp)
    return 0.5 * (logp - ref_logp) ** 2


def k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1. (B, T), (B, T) -> (B, T). Unbiased, >= 0.

    ``expm1`` keeps it accurate when ref - logp is tiny (e^x - 1 - x would cancel to 0 or go
    slightly negative in floating point).
    """
    _check(logp, ref_logp)
    diff = ref_logp - logp
    # expm1(x) >= x holds in floating point too, so the clamp only removes rounding noise.
    return (torch.expm1(diff) - diff).clamp(min=0.0)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": k1, "k2": k2, "k3": k3}
"""Estimator name -> per-token function (logp, ref_logp) -> (B, T)."""
