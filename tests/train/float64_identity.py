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
