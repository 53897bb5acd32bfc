"""Fused CPU kernels for the static decoder's step (grpokit/native/kernels/decode.cpp).

A decoding step at the batch sizes of a rollout is, besides the linear layers, about 40 small
eager operations per layer (norms, rotary embedding, cache writes, attention over the cache, the
gated activation): on the embedded model at batch 8 they took half of a step, mostly in dispatch
and intermediate tensors (bench/RESULTS.md). Four kernels here do the same arithmetic in four
calls per layer, rounding to the compute dtype where the eager code rounds; a fifth adds a LoRA
adapter's share to a projection (one call where the eager code makes two products per adapter,
a scaling and a sum); a sixth computes the float32 linear layers themselves where that is faster
than oneDNN (:class:`BlockedLinear`; where: grpokit.native.heuristics).

They are built for this machine on first use (grpokit.native.build). With no compiler, or a failed
build, the decoder keeps its eager step and says why once; ``GRPOKIT_FUSED_DECODE=0`` keeps it
too (for comparisons).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from grpokit.native.build import load


@functools.cache
def decode_kernels() -> Any | None:
    """``torch.ops.grpokit_decode`` (add_rms_norm, rope_cache, decode_attention, silu_mul,
    lora_add, blocked_linear), built and loaded on first call; None where they cannot be
    (logged once) or are switched off."""
    return load("decode", "grpokit_decode", "GRPOKIT_FUSED_DECODE", "decoding with eager ops")


BLOCK = 16
"""Output features per block of :class:`BlockedLinear`'s layout (the kernel's two 8-lane
registers)."""


class BlockedLinear:
    """One float32 linear layer for decoding, through ``blocked_linear`` (kernels/decode.cpp):
    its weight copied into blocks of 16 output features, each block's (K, 16) contiguous, so
    that a step with few rows reads it as one prefetched stream. A snapshot of the weight, as
    oneDNN's prepacked copy (grpokit.models.onednn.PackedLinear) is; the same interface.

    Args:
        weight: (out, in) float32 on CPU; bias: (out,) or None.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        kernels = decode_kernels()
        if kernels is None:
            raise RuntimeError("BlockedLinear needs grpokit's decode kernels")
        self.kernels = kernels
        out_features, in_features = (int(s) for s in weight.shape)
        pad = -out_features % BLOCK
        padded = weight.detach().float()
        if pad:
            padded = torch.nn.functional.pad(padded, (0, 0, 0, pad))
        self.out_features = out_features
        self.blocks = padded.view(-1, BLOCK, in_features).transpose(1, 2).contiguous()
        self.bias = None
        if bias is not None:
            self.bias = torch.nn.functional.pad(bias.detach().float(), (0, pad))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) float32 -> (..., out)."""
        out: torch.Tensor = self.kernels.blocked_linear(
            x.reshape(-1, x.shape[-1]), self.blocks, self.bias, self.out_features
        )
        return out.view(*x.shape[:-1], self.out_features)
