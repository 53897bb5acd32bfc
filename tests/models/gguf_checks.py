"""Checks shared by the GGUF export tests: the same prompt, tokens and greedy continuation in
PyTorch and in llama.cpp (grpokit.models.gguf_runtime, through cyllama)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpokit.models.gguf_runtime import GGUFModel
from grpokit.models.loading import LoraSettings, Policy, load_policy
from grpokit.models.tiny import TINY_CONFIG


def perturbed_lora_checkpoint(base: Path, out: Path, seed: int = 0) -> Policy:
    """A LoRA policy on ``base`` whose adapter changes the outputs, saved as a grpokit
    checkpoint at ``out`` (checkpoint-N/model layout)."""
    lora = LoraSettings(r=4, alpha=8.0, dropout=0.0, target_modules="all-linear")
    policy = load_policy(str(base), lora=lora, need_reference=False)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    policy.model.eval()
    policy.save(out)
    return policy


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    ids: list[int] = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return ids


def torch_greedy(model: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    """Greedy continuation by plain argmax over full forwards (no cache, no sampling code)."""
    model.eval()
    x = torch.tensor([ids])
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(input_ids=x).logits[0, -1].argmax())
            out.append(nxt)
            x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
    return out


def llama_greedy(llm: GGUFModel, ids: list[int], n: int) -> list[int]:
    return llm.greedy(ids, n)


def open_llama(path: Path) -> GGUFModel:
    pytest.importorskip("cyllama", reason="cyllama runs the GGUF export in llama.cpp")
    # An f32 KV cache (llama.cpp's default is f16) so that an f32 export is compared with
    # PyTorch at full precision: random tiny models have near ties that f16 rounding flips.
    return GGUFModel(path, n_ctx=256, n_threads=1, f32_cache=True)


# Per family, the config fields of a tiny model that exercise what the GGUF mapping must get right:
# a head size other than hidden/heads (Qwen3), sliding-window layers narrower than the prompts
# and local/global RoPE bases (Gemma), tied embeddings where llama.cpp wants an output layer of
# its own (OLMo 2).
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "mistral": {"sliding_window": None},
    "qwen3": {"head_dim": 32},
    "smollm3": {"num_hidden_layers": 4},  # its 4th layer has no RoPE
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8},
    "gemma3_text": {
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
    },  # fmt: skip
    "gemma3": {
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
    },  # vision-language
    "phi3": {"tie_word_embeddings": False},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 128, "n_positions": 2048},
    "olmo2": {},
}
"""transformers model types of :func:`tiny_of`, with their config fields beyond TINY_CONFIG."""


def tiny_of(kind: str, tokenizer_dir: Path, out: Path, seed: int = 3) -> Path:
    """A tiny random model of one of :data:`FAMILIES` with a given tokenizer, saved to ``out``.

    Norm weights and biases, which start at constants (zero for Gemma's norms and every bias),
    get random values too, so that a wrong offset, transpose or bias shows in the outputs.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    settings = {**TINY_CONFIG, "vocab_size": len(tokenizer), "initializer_range": 0.3,
                "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                "pad_token_id": tokenizer.pad_token_id, **FAMILIES[kind]}  # fmt: skip
    if kind == "gpt2":
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size", "max_position_embeddings"):  # fmt: skip
            settings.pop(name)
    if kind == "gemma3":  # the language model's settings, beside a small vision tower
        vision = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "intermediate_size": 64, "image_size": 32, "patch_size": 16}  # fmt: skip
        settings = {"text_config": settings, "vision_config": vision, "mm_tokens_per_image": 4,
                    "initializer_range": 0.3}  # fmt: skip
    config = AutoConfig.for_model(kind, **settings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("bias") or (param.ndim == 1 and ("norm" in name or "ln_" in name)):
                    param.add_(torch.randn_like(param) * 0.3)
            if kind in ("gemma2", "gemma3_text", "gemma3"):
                # Gemma scales the embeddings by sqrt(hidden size) and normalises each layer's
                # output: at this init the input token outweighs the layers, and a random model
                # repeats it forever. Undo the scale at init, so the layers steer the output.
                hidden = config.get_text_config().hidden_size
                model.get_input_embeddings().weight.div_(float(hidden) ** 0.5)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
