"""Fused CPU kernels for the static decoder's step (grpokit/kernels/decode.cpp).

A decoding step at the batch sizes of a rollout is, besides the linear layers, about 40 small
eager operations per layer (norms, rotary embedding, cache writes, attention over the cache, the
gated activation): on the embedded model at batch 8 they took half of a step, mostly in dispatch
and intermediate tensors (bench/README.md). Four kernels here do the same arithmetic in four
calls per layer, rounding to the compute dtype where the eager code rounds; a fifth adds a LoRA
adapter's share to a projection (one call where the eager code makes two products per adapter,
a scaling and a sum).

They are built for this machine on first use (grpokit.native). With no compiler, or a failed
build, the decoder keeps its eager step and says why once; ``GRPOKIT_FUSED_DECODE=0`` keeps it
too (for comparisons).
"""

from __future__ import annotations

import functools
from typing import Any

from grpokit import native


@functools.cache
def decode_kernels() -> Any | None:
    """``torch.ops.grpokit_decode`` (add_rms_norm, rope_cache, decode_attention, silu_mul,
    lora_add), built and loaded on first call; None where they cannot be (logged once) or are
    switched off."""
    return native.load(
        "decode", "grpokit_decode", "GRPOKIT_FUSED_DECODE", "decoding with eager ops"
    )
