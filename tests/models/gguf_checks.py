"""Checks shared by the GGUF export tests: the same prompt, tokens and greedy continuation in
PyTorch and in llama.cpp (llama-cpp-python)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpokit.models.tiny import TINY_CONFIG


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


def llama_greedy(llm: Any, ids: list[int], n: int) -> list[int]:
    out: list[int] = []
    for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        out.append(int(token))
        if len(out) == n:
            break
    return out


def open_llama(path: Path, *, logits_all: bool = False) -> Any:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python runs the GGUF export")
    # An f32 KV cache (llama.cpp's default is f16) so that an f32 export is compared with
    # PyTorch at full precision: random tiny models have near ties that f16 rounding flips.
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=256,
        n_threads=1,
        logits_all=logits_all,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        verbose=False,
    )


def tiny_of(kind: str, tokenizer_dir: Path, out: Path) -> Path:
    """A tiny random model of another architecture (qwen2, mistral) with a given tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    settings = {**TINY_CONFIG, "vocab_size": len(tokenizer), "initializer_range": 0.3,
                "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}  # fmt: skip
    if kind == "mistral":
        settings["sliding_window"] = None
    config = AutoConfig.for_model(kind, **settings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    if kind == "qwen2":  # the q/k/v biases are zero at init; give them values worth checking
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("proj.bias"):
                    param.normal_(0, 0.3)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
