"""Tiny randomly initialised Llama models with the real SmolLM2 tokenizer, for fast tests and
benchmarks of the machinery (not of learning): they load and run in well under a second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpokit.models.embedded import embedded_model_dir

TINY_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
"""The default shape: 2 layers of width 64 (about 3.3M parameters, nearly all the embedding)."""


def make_tiny_model_dir(
    out_dir: str | Path,
    *,
    seed: int = 0,
    tokenizer_dir: str | Path | None = None,
    **config_overrides: Any,
) -> Path:
    """Save a randomly initialised ``LlamaForCausalLM`` plus a tokenizer to ``out_dir``.

    Args:
        out_dir: directory to write (created).
        seed: seed of the weight initialisation; the same seed gives the same weights.
        tokenizer_dir: where the tokenizer (and chat template) comes from; default the embedded
            SmolLM2 model (converted on first use). Its vocabulary size sets the model's.
        config_overrides: LlamaConfig fields replacing :data:`TINY_CONFIG`'s.

    Returns:
        ``out_dir`` as a Path.
    """
    from transformers import LlamaForCausalLM

    return _save_tiny(LlamaForCausalLM, out_dir, seed, tokenizer_dir, config_overrides)


def make_tiny_classifier_dir(
    out_dir: str | Path,
    *,
    seed: int = 0,
    tokenizer_dir: str | Path | None = None,
    num_labels: int = 1,
    **config_overrides: Any,
) -> Path:
    """Save a randomly initialised ``LlamaForSequenceClassification`` (a reward model's shape:
    one logit per text, read at its last non-pad token) plus a tokenizer to ``out_dir``.

    The same arguments as :func:`make_tiny_model_dir`; ``num_labels`` logits per text. The
    config's ``pad_token_id`` is set, so batches of several texts can be scored.
    """
    from transformers import LlamaForSequenceClassification

    overrides = {"num_labels": num_labels, "tie_word_embeddings": False, **config_overrides}
    return _save_tiny(LlamaForSequenceClassification, out_dir, seed, tokenizer_dir, overrides)


def _save_tiny(
    model_class: Any,
    out_dir: str | Path,
    seed: int,
    tokenizer_dir: str | Path | None,
    config_overrides: dict[str, Any],
) -> Path:
    from transformers import AutoTokenizer, LlamaConfig

    out = Path(out_dir)
    source = Path(tokenizer_dir) if tokenizer_dir is not None else embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    settings: dict[str, Any] = {
        **TINY_CONFIG,
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        **config_overrides,
    }
    config = LlamaConfig(**settings)
    # Fork the RNG so building a model does not change the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    if model.can_generate():
        model.generation_config.eos_token_id = eos_id
        model.generation_config.pad_token_id = pad_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
