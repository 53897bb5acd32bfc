"""Under CPU bfloat16 autocast, short sequences keep transformers' SDPA forward to the bit and get
their attention gradient in float32 (grpokit.models.attention); masks, grouped heads and the
cases it leaves to flash attention's own backward."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpokit.models.attention import (
    ATTENTION,
    FLOAT32_BACKWARD_SCORES,
    _attention,
    attention_backward,
    use_float32_attention_backward,
)
from grpokit.models.onednn import set_compute_dtype


class _Module(torch.nn.Module):
    """What transformers' attention functions read from the calling layer."""

    is_causal = True
    num_key_value_groups = 3


def _inputs(batch: int, queries: int, keys: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(batch, 6, queries, 16), (batch, 2, keys, 16), (batch, 2, keys, 16)]
    return [torch.randn(s, generator=g).requires_grad_(True) for s in shapes]


def _exact(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """Attention in float64 from the bfloat16-rounded inputs autocast gives SDPA: (B, Sq, H, D).
    The rounding passes gradients through unrounded."""
    q, k, v = (
        t.double() + (t.to(torch.bfloat16).double() - t.double()).detach() for t in (q, k, v)
    )
    k, v = k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)
    scores = q @ k.transpose(-1, -2) / 4.0
    if causal:
        allowed = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    return (probs @ v).transpose(1, 2)


CASES = {
    "causal": (1, 37, 37, False),  # a shared prompt: no mask, causal
    "mask": (4, 25, 62, True),  # completions after it: a boolean mask, left padding
    "causal-longer-keys": (2, 8, 12, False),  # transformers keeps the first 8 keys
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_is_sdpa_to_the_bit_and_backward_is_exact_in_float32(case: str) -> None:
    batch, queries, keys, with_mask = CASES[case]
    mask = None
    if with_mask:
        mask = torch.ones(batch, 1, queries, keys, dtype=torch.bool).tril(keys - queries)
        mask[1, :, :, :5] = False  # a left-padded row
        mask[1, :, 0, :] = False  # one of its queries attends nothing
    q, k, v = _inputs(batch, queries, keys)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, _ = _attention(_Module(), q, k, v, mask)
        theirs, _ = sdpa_attention_forward(_Module(), q, k, v, mask)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, theirs)

    grad = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1)).to(ours.dtype)
    got = torch.autograd.grad(ours, (q, k, v), grad)
    flash = torch.autograd.grad(theirs, (q, k, v), grad)
    want = torch.autograd.grad(_exact(q, k, v, mask, mask is None), (q, k, v), grad.double())
    for ours_g, flash_g, exact_g in zip(got, flash, want, strict=True):
        scale = float(exact_g.abs().max())
        # float32 products from rounded inputs: float32's error, far below flash's bfloat16
        torch.testing.assert_close(ours_g, exact_g, rtol=0, atol=1e-5 * scale)
        assert float((flash_g - exact_g).abs().max()) > 1e-4 * scale


def test_attention_backward_matches_autograd_with_an_additive_mask() -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 5, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 7, 8, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 7, 8, dtype=torch.float64, generator=g, requires_grad=True)
    mask = torch.randn(2, 1, 5, 7, dtype=torch.float64, generator=g)
    grad = torch.randn(2, 4, 5, 8, dtype=torch.float64, generator=g)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True
    )
    want = torch.autograd.grad(out, (q, k, v), grad)
    got = attention_backward(
        q.detach(), k.detach(), v.detach(), grad, scale=0.3, causal=False, mask=mask
    )
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "setting",
    ["long", "no-grad", "no-autocast", "dropout"],
)
def test_flash_backward_kept_where_the_float32_one_does_not_apply(setting: str) -> None:
    """Longer sequences, no gradient, float32 compute and dropout go to transformers' function
    as before (the graph then holds its SDPA backward)."""
    length = math.isqrt(FLOAT32_BACKWARD_SCORES) + 1 if setting == "long" else 16
    q, k, v = _inputs(1, length, length)
    kwargs: dict[str, Any] = {"dropout": 0.5} if setting == "dropout" else {}
    with (
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=setting != "no-autocast"),
        torch.set_grad_enabled(setting != "no-grad"),
    ):
        out, _ = _attention(_Module(), q, k, v, None, **kwargs)
    node = type(out.grad_fn).__name__ if out.grad_fn is not None else None
    assert node != "_Float32BackwardBackward"
    assert (node is None) == (setting == "no-grad")


def small_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def test_only_bfloat16_models_with_sdpa_switch() -> None:
    assert not use_float32_attention_backward(small_llama())  # no compute dtype
    eager = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            **{**small_llama().config.to_dict(), "attn_implementation": "eager"}
        )
    )
    set_compute_dtype(eager, torch.bfloat16)
    assert not use_float32_attention_backward(eager)
    assert eager.config._attn_implementation == "eager"


def test_switched_model_has_the_same_logits_and_nearer_gradients(tmp_path: Path) -> None:
    """Left-padded rows and all, the switched model's logits are the SDPA model's to the bit; its
    gradients differ from flash attention's by bfloat16's rounding; its saved config does not
    name the function."""
    ids = torch.randint(128, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0

    def logits_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids, attention_mask=mask).logits
        logits.float()[mask.bool()].logsumexp(-1).sum().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    sdpa = small_llama()
    set_compute_dtype(sdpa, torch.bfloat16)
    before, flash_grads = logits_and_grads(sdpa)
    switched = small_llama()
    set_compute_dtype(switched, torch.bfloat16)
    assert use_float32_attention_backward(switched)
    assert switched.config._attn_implementation == ATTENTION
    after, grads = logits_and_grads(switched)
    assert torch.equal(after, before)
    assert len(grads) == len(flash_grads)
    assert any(not torch.equal(a, b) for a, b in zip(grads, flash_grads, strict=True))
    for a, b in zip(grads, flash_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.05 * float(b.abs().max()))
    switched.save_pretrained(tmp_path)
    assert ATTENTION not in (tmp_path / "config.json").read_text()
