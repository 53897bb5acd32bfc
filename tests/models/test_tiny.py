from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def test_tiny_model_fixture(
    tiny_model: PreTrainedModel, tiny_tokenizer: PreTrainedTokenizerBase
) -> None:
    assert tiny_model.config.num_hidden_layers == 2 and tiny_model.config.hidden_size == 64
    assert tiny_model.config.vocab_size == len(tiny_tokenizer) == 49152
    assert tiny_model.config.eos_token_id == tiny_tokenizer.eos_token_id == 2
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = tiny_tokenizer(text, return_tensors="pt")["input_ids"]
    assert tiny_model(input_ids=ids).logits.shape == (1, ids.shape[1], 49152)


def test_factory_seeds_and_overrides(
    tiny_model_factory: Callable[..., Path], tiny_model_dir: Path
) -> None:
    assert tiny_model_factory(seed=0) == tiny_model_dir  # cached per arguments
    same = load_file(str(tiny_model_factory(seed=0) / "model.safetensors"))
    other = load_file(str(tiny_model_factory(seed=5) / "model.safetensors"))
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(same[key], other[key])
    wide = tiny_model_factory(seed=5, hidden_size=32, intermediate_size=48)
    assert load_file(str(wide / "model.safetensors"))[key].shape == (48, 32)


def test_qwen2_model_in_bfloat16(tmp_path: Path) -> None:
    """model_type qwen2 builds Qwen2's architecture (biased query, key and value projections)
    with the tokenizer's ids, initialised and saved in the dtype asked for."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.models.tiny import make_tiny_model_dir, make_tiny_tokenizer_dir

    tokenizer_dir = make_tiny_tokenizer_dir(tmp_path / "tokenizer", "qwen2")
    out = make_tiny_model_dir(
        tmp_path / "model",
        tokenizer_dir=tokenizer_dir,
        model_type="qwen2",
        dtype=torch.bfloat16,
        rope_theta=1e6,
    )
    assert torch.get_default_dtype() == torch.float32  # restored
    saved = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert "lm_head.weight" not in saved  # tied, as TINY_CONFIG says
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    attention = model.model.layers[0].self_attn
    assert all(getattr(attention, p).bias is not None for p in ("q_proj", "k_proj", "v_proj"))
    assert attention.o_proj.bias is None
    assert model.config.rope_parameters["rope_theta"] == 1e6
    assert model.config.vocab_size == len(tokenizer)
    assert (
        model.config.eos_token_id == tokenizer.eos_token_id == model.generation_config.eos_token_id
    )
    with pytest.raises(ValueError, match="unknown model_type 'gpt2'"):
        make_tiny_model_dir(tmp_path / "other", tokenizer_dir=tokenizer_dir, model_type="gpt2")
