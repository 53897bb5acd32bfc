"""Attention for training forwards that compute in bfloat16 on CPU (``model.dtype: auto``).

Under CPU autocast, transformers' SDPA attention runs PyTorch's flash attention for CPU in
bfloat16, whose backward pass has a cost per (sequence, head) that dominates at the lengths of
short completions. Forward + backward measured on one thread (Intel Xeon with AMX; 9 heads of 64,
3 key/value heads, causal), bfloat16 against float32: 4 x 64 positions 5.4 vs 1.6 ms; 4 x 128
11.9 vs 5.3 ms; 4 x 256 17.2 vs 16.7 ms; 2 x 1024 58.9 vs 96.0 ms; 8 x 512 99.6 vs 130.7 ms. So
sequences of up to :data:`FLOAT32_UP_TO` positions attend in float32 (which also rounds nothing
that bfloat16 would), longer ones in bfloat16 as before. The old, new and reference log-probs of
a step all come from the same forward, so they compare like with like either way.
"""

from __future__ import annotations

from typing import Any

import torch

from grpokit.models.compat import hf_model
from grpokit.models.onednn import compute_dtype

ATTENTION = "grpokit_sdpa"
"""The name the attention function is registered under with transformers."""

FLOAT32_UP_TO = 256
"""The longest sequence (query or key positions) attended to in float32 under CPU autocast."""


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' SDPA attention; in float32 for short sequences under CPU autocast."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    short = max(query.shape[-2], key.shape[-2]) <= FLOAT32_UP_TO
    if query.device.type == "cpu" and torch.is_autocast_enabled("cpu") and short:
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        with torch.autocast("cpu", enabled=False):
            out: tuple[torch.Tensor, torch.Tensor | None] = sdpa_attention_forward(
                module, query.float(), key.float(), value.float(), attention_mask, **kwargs
            )
        return out
    result: tuple[torch.Tensor, torch.Tensor | None] = sdpa_attention_forward(
        module, query, key, value, attention_mask, **kwargs
    )
    return result


def use_short_float32_attention(model: torch.nn.Module) -> bool:
    """Switch a model marked to compute in bfloat16 (grpokit.models.onednn.set_compute_dtype)
    from transformers' SDPA attention to :func:`_attention` (the same, masks included, but for
    the dtype of short sequences). Returns whether it switched: not for a model without the mark
    or with another attention implementation. Nothing is saved with the model's config."""
    inner: Any = hf_model(model)
    config = getattr(inner, "config", None)
    if compute_dtype(model) is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    inner.set_attn_implementation(ATTENTION)
    return True
