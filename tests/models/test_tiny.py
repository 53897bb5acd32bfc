from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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
