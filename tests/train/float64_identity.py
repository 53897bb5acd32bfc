"""Identities checked in float64: the trainer or model cast, and Llama's RMSNorm in the input's
precision (the ``float64`` fixture in conftest.py; the distributed worker uses them directly).

Two computations that are equal in exact arithmetic (one micro-batch split or another, one
process or two, chunked or not) differ in float32 by rounding whose size depends on the CPU's
kernels, and Adam turns a gradient entry that is zero up to rounding into a step of +-lr: a float32
tolerance that holds on one CPU fails on another (a relative difference of 1.9e-4 against 1e-4 on
an Intel CPU with AMX, 4e-5 on an AMD EPYC). In float64 the rounding is about 1e-16, so a tolerance
of 1e-9 has room on any CPU and still catches a real difference. transformers' RMSNorm computes
in float32 even for float64 inputs, which would leave float32 rounding (in the backward, where it
depends on the batch layout): it is replaced by the same formula in the input's precision.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch


def rms_norm_in_input_precision(self: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Llama's RMSNorm, computed in float64 for float64 inputs (float32 otherwise, as
    transformers' own)."""
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    h = hidden.to(dtype)
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * normed.to(hidden.dtype)


def use_rms_norm_in_input_precision() -> None:
    """For this whole process (a worker script; tests use the fixture, which undoes it)."""
    from transformers.models.llama import modeling_llama

    modeling_llama.LlamaRMSNorm.forward = rms_norm_in_input_precision  # type: ignore[method-assign]


def to_float64(x: Any) -> Any:
    """A model, or a GRPOTrainer's policy and reference, cast to float64 in place; returns x."""
    if isinstance(x, torch.nn.Module):
        return x.double()
    x.policy.model.double()
    if x.policy.reference is not None:
        x.policy.reference.double()
    return x


UPDATE_SETTINGS: dict[str, Any] = {
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "beta": 0.04,
    "num_iterations": 2,
    "learning_rate": 1e-2,
}
"""training: settings of the update identities: micro-batches of 4 rows, two optimizer steps per
batch (so old log-probs), a KL to the reference, and a learning rate at which Adam would turn
float32 rounding into visible differences."""

Update = tuple[dict[str, torch.Tensor], list[dict[str, float]]]
"""The weights after an update (name -> tensor) and the update's metrics, one dict a step."""


def updated(trainer: Any, exp: Any) -> Update:
    """Run ``trainer.update(exp)``; the weights after it and its metrics."""
    metrics = trainer.update(exp)
    params = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
    return params, metrics


def assert_same_update(
    a: Update, b: Update, keys: tuple[str, ...] = ("loss", "grad_norm", "kl")
) -> None:
    """Two float64 updates of the same identity: weights to 1e-9 relative, metrics too."""
    (params_a, metrics_a), (params_b, metrics_b) = a, b
    for name in params_a:
        error = float(
            (params_a[name] - params_b[name]).norm() / max(float(params_a[name].norm()), 1e-12)
        )
        assert error < 1e-9, (name, error)
    for m_a, m_b in zip(metrics_a, metrics_b, strict=True):
        for key in keys:
            assert m_a[key] == pytest.approx(m_b[key], rel=1e-9, abs=1e-12), key
