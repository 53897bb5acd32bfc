"""Attention for training forwards that compute in bfloat16 on CPU (``model.dtype: auto``): the
forward of transformers' SDPA attention, unchanged; for short sequences a float32 backward.

Under CPU autocast, SDPA runs PyTorch's flash attention for CPU in bfloat16. Its backward pass
has a cost per (sequence, head) that dominates at the lengths of short completions, and it
rounds its intermediate products and its gradients to bfloat16. Forward + backward, one thread,
Intel Xeon with AMX (9 query heads of 64, 3 key/value heads), SDPA against this module: 1 x 37
positions (a shared prompt) 1.48 vs 0.66 ms; 4 x 25 queries over 62 keys (completions after it)
3.44 vs 2.22 ms; 4 x 128 11.9 vs 7.8 ms; 4 x 96 over 160 10.0 vs 6.7 ms; 4 x 160 14.4 vs 13.7 ms;
the backward here grows with queries x keys, flash attention's less. So up to
:data:`FLOAT32_BACKWARD_SCORES` query-key pairs per head the gradient is computed here, from the
attention weights recomputed in float32 out of the same bfloat16-rounded inputs the forward
used; longer sequences keep flash attention's backward.

The forward is transformers' own function, called as before: log-probs, importance ratios and
the KL term are what they were to the bit. Only the gradient changes, to a more exact one (flash
attention's bfloat16 backward differs from float32 by about 1% of its largest value).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpokit.models.compat import hf_model
from grpokit.models.onednn import compute_dtype

ATTENTION = "grpokit_sdpa"
"""The name the attention function is registered under with transformers."""

FLOAT32_BACKWARD_SCORES = 144 * 144
"""The most query x key positions (per sequence and head) whose attention gradient is computed
here; the measured break-even is near 160 x 160."""


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention (query (B, H, Sq, D), key and value (B, Hkv, Sk, D));
    returns ((B, Sq, H, D), None) as it does, with a float32 backward where that is faster."""
    if _float32_backward_applies(query, key, value, attention_mask, kwargs):
        out: torch.Tensor = _Float32Backward.apply(  # type: ignore[no-untyped-call]
            query, key, value, attention_mask, module, kwargs
        )
        return out, None
    result, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return result, None


def _float32_backward_applies(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> bool:
    """A gradient is wanted, under CPU autocast, for a short sequence, and with nothing the
    float32 backward does not reproduce (dropout, a position bias, soft-capping)."""
    return (
        query.device.type == "cpu"
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (query, key, value))
        and torch.is_autocast_enabled("cpu")
        and query.shape[-2] * key.shape[-2] <= FLOAT32_BACKWARD_SCORES
        and not kwargs.get("dropout")
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and query.shape[1] % key.shape[1] == 0
        and (mask is None or mask.ndim == 4)
    )


class _Float32Backward(torch.autograd.Function):
    """transformers' SDPA attention forward; backward through softmax(q k^T * scale + mask) v
    recomputed in float32 from the inputs rounded as autocast rounded them for the forward."""

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        module: torch.nn.Module,
        kwargs: dict[str, Any],
    ) -> torch.Tensor:
        out, _ = sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        # transformers' rule: causal (upper-left aligned, as flash attention's is_causal) when
        # there is no mask, more than one query and a causal module.
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", True) if causal is None else causal
        ctx.causal = bool(causal) and mask is None and query.shape[-2] > 1
        scaling = kwargs.get("scaling")
        ctx.scale = 1.0 / math.sqrt(query.shape[-1]) if scaling is None else float(scaling)
        ctx.rounded_to = torch.get_autocast_dtype("cpu")
        ctx.save_for_backward(query, key, value, mask)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        query, key, value, mask = ctx.saved_tensors
        q, k, v = (t.to(ctx.rounded_to).float() for t in (query, key, value))
        dq, dk, dv = attention_backward(
            q,
            k,
            v,
            grad_out.transpose(1, 2).float(),
            scale=ctx.scale,
            causal=ctx.causal,
            mask=None if mask is None else _additive(mask, ctx.rounded_to),
        )
        return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype), None, None, None


def _additive(mask: torch.Tensor, rounded_to: torch.dtype) -> torch.Tensor:
    """SDPA's mask as an additive float32 one: a boolean mask attends where True; a float mask
    is added to the scores after autocast's rounding, as in the forward."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
    return mask.to(rounded_to).float()


def attention_backward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of O = softmax(S) V, S = Q K^T * scale + mask (or causal), by the textbook
    formulas: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K * scale,
    dK = dS^T Q * scale.

    query (B, H, Sq, D); key, value (B, Hkv, Sk, D) with H a multiple of Hkv (grouped-query
    heads share a key/value head, whose gradient is the sum over its group); grad_out
    (B, H, Sq, D); mask additive, broadcastable to (B, H, Sq, Sk); causal: query i attends keys
    0..i. A query that attends no key gets no gradient. Returns (dQ, dK, dV) shaped as the
    inputs, in their dtype.
    """
    groups = query.shape[1] // key.shape[1]
    keys = key.repeat_interleave(groups, dim=1)
    values = value.repeat_interleave(groups, dim=1)
    scores = (query @ keys.transpose(-1, -2)) * scale
    if causal:
        allowed = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1).nan_to_num_(nan=0.0)  # rows with no key: NaN -> 0
    grad_values = probs.transpose(-1, -2) @ grad_out
    grad_probs = grad_out @ values.transpose(-1, -2)
    grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
    grad_query = (grad_scores @ keys) * scale
    grad_keys = (grad_scores.transpose(-1, -2) @ query) * scale
    b, h, sk, d = keys.shape
    grad_keys = grad_keys.view(b, h // groups, groups, sk, d).sum(2)
    grad_values = grad_values.view(b, h // groups, groups, sk, d).sum(2)
    return grad_query, grad_keys, grad_values


def use_float32_attention_backward(model: torch.nn.Module) -> bool:
    """Switch a model marked to compute in bfloat16 (grpokit.models.onednn.set_compute_dtype)
    from transformers' SDPA attention to :func:`_attention` (the same forward, masks included).
    Returns whether it switched: not for a model without the mark or with another attention
    implementation. Nothing is saved with the model's config."""
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
