"""Short sequences attend in float32 under CPU bfloat16 autocast, long ones in bfloat16, through
transformers' own SDPA attention (masks included)."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpokit.models.attention import (
    ATTENTION,
    FLOAT32_UP_TO,
    _attention,
    use_short_float32_attention,
)
from grpokit.models.onednn import set_compute_dtype


def small_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2 * FLOAT32_UP_TO,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


class _Module(torch.nn.Module):
    """What transformers' attention functions read from the calling layer."""

    is_causal = True
    num_key_value_groups = 2


@pytest.mark.parametrize("length", [FLOAT32_UP_TO, FLOAT32_UP_TO + 1], ids=["short", "long"])
def test_short_sequences_attend_in_float32(length: int) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, length, 16, generator=g, requires_grad=True)
    k = torch.randn(2, 2, length, 16, generator=g, requires_grad=True)
    v = torch.randn(2, 2, length, 16, generator=g, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, _ = _attention(_Module(), q, k, v, None)
        theirs, _ = sdpa_attention_forward(_Module(), q, k, v, None)
    want, _ = sdpa_attention_forward(_Module(), q, k, v, None)  # no autocast: float32
    short = length <= FLOAT32_UP_TO
    assert ours.dtype == (torch.float32 if short else torch.bfloat16)
    assert torch.equal(ours, want if short else theirs)
    ours.float().sum().backward()  # the gradient reaches the float32 inputs either way
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_only_bfloat16_models_with_sdpa_switch() -> None:
    plain = small_llama()
    assert not use_short_float32_attention(plain)  # no compute dtype: nothing to change
    eager = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            **{**small_llama().config.to_dict(), "attn_implementation": "eager"}
        )
    )
    set_compute_dtype(eager, torch.bfloat16)
    assert not use_short_float32_attention(eager)
    assert eager.config._attn_implementation == "eager"


def test_switched_model_computes_as_before_but_for_the_attention_dtype(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Padded rows (a mask) and all, the switched model under autocast computes what it did
    before to the rounding of a bfloat16 attention; its saved config does not name it."""
    model = small_llama()
    set_compute_dtype(model, torch.bfloat16)
    ids = torch.randint(128, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = model(input_ids=ids, attention_mask=mask).logits
    assert use_short_float32_attention(model)
    assert model.config._attn_implementation == ATTENTION
    with torch.autocast("cpu", dtype=torch.bfloat16):
        after = model(input_ids=ids, attention_mask=mask).logits
    # bfloat16 attention rounds its inputs and output once each: the logits move by that only
    torch.testing.assert_close(after[mask.bool()], before[mask.bool()], rtol=0.05, atol=0.05)
    assert not torch.equal(after, before)
    model.save_pretrained(tmp_path)
    assert ATTENTION not in (tmp_path / "config.json").read_text()
