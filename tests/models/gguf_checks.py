"""Checks shared by the GGUF export tests: the same prompt, tokens, logits and greedy continuation
in PyTorch and in llama.cpp (grpokit.models.gguf_runtime, through cyllama)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grpokit.models.gguf_arch import activation, arch_spec, text_config
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


# How far llama.cpp's logits may be from PyTorch's float32 ones. The tiny models' logits spread
# over several units (largest |logit| 1.6 to 16): a wrong tensor or setting moves them by a good
# part of that (a dropped bias, positions shifted by one, K and V swapped: 2 to 19 on GPT-2).
#
# f32 file: the largest difference, as a fraction of the largest |logit|.
# - llama.cpp does the same float32 arithmetic in another order (matmul blocking, SIMD partial
#   sums, vectorised exp). Each operation rounds by at most 2^-24 (6e-8) relative, a 128-term dot
#   product by at most 128 times that; measured 1e-6 to 5e-6 across the families: 1e-4 leaves a
#   factor of 20.
# - Except for the tanh-GELU families (GPT-2, Gemma): ggml's CPU GELU reads a table indexed by
#   the float16-rounded input and holds float16 values, two roundings of up to 2^-11 (4.9e-4)
#   relative at every MLP activation; measured 3e-4 to 6e-4: 2e-3 leaves a factor of 3. (A
#   PyTorch reference rounding its GELU the same way still differs by 3e-5 to 2e-4, from inputs
#   on either side of a float16 rounding boundary.)
F32_TOLERANCE = 1e-4
GELU_F32_TOLERANCE = 2e-3
# f16 file: the root mean square difference over all logits, against that of PyTorch's own logits
# when the weights are rounded to float16 as the file stores them (:func:`f16_rounding_effect`).
# ggml also rounds the activations that meet an f16 weight to float16: two independent roundings
# of the same unit where PyTorch's has one, about sqrt(2) times the difference when the two are
# of a size; measured 1.08 to 1.42 times across the families and prompts (the largest difference
# alone varies more, 0.8 to 2.2 times). 2.5 leaves a factor of 1.8.
F16_ROUNDING_FACTOR = 2.5


def torch_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab) float32 logits of one forward over ``ids``."""
    # In train mode dropout makes the reference random: GPT-2's config drops 10% of activations,
    # which moves its logits by a quarter of their size and more.
    assert not model.training, "the reference model must be in eval mode (dropout)"
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=torch.tensor([ids])).logits[0]
    return logits.float()


def llama_logits(llm: GGUFModel, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab) logits of llama.cpp over ``ids`` from an empty context."""
    return torch.from_numpy(np.array(llm.logits(ids), dtype=np.float32))


def _rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt())


def f16_rounding_effect(model: torch.nn.Module, ids: list[int]) -> float:
    """Root mean square change of the logits over ``ids`` when the weights an f16 export stores as
    float16 (every tensor of two or more dimensions) are rounded to float16, computed in
    float32."""
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for param in rounded.parameters():
            if param.ndim >= 2:
                param.copy_(param.to(torch.float16).float())
    return _rms(torch_logits(rounded, ids) - torch_logits(model, ids))


def f32_tolerance(model: torch.nn.Module) -> float:
    """:data:`F32_TOLERANCE`, or :data:`GELU_F32_TOLERANCE` for a model with a GELU."""
    config: Any = model.config
    act = activation(text_config(config, arch_spec(config))) or ""
    return GELU_F32_TOLERANCE if "gelu" in act else F32_TOLERANCE


def assert_close_logits(llm: GGUFModel, model: torch.nn.Module, ids: list[int], outtype: str = "f32"
                        ) -> float:  # fmt: skip
    """llama.cpp's logits at every position of ``ids`` as close to PyTorch's as ``outtype``'s
    rounding explains (see :data:`F32_TOLERANCE`, :data:`F16_ROUNDING_FACTOR`); returns the
    measure compared (f32: largest difference, f16: root mean square difference)."""
    expected = torch_logits(model, ids)
    got = llama_logits(llm, ids)
    assert got.shape == expected.shape
    scale = float(expected.abs().max())
    if outtype == "f32":
        measured, allowed = float((got - expected).abs().max()), f32_tolerance(model) * scale
        what = "largest difference"
    elif outtype == "f16":
        measured = _rms(got - expected)
        allowed = F16_ROUNDING_FACTOR * f16_rounding_effect(model, ids)
        what = "root mean square difference"
    else:
        raise ValueError(f"no logit tolerance for {outtype}")
    assert measured <= allowed, (
        f"{outtype}: llama.cpp's logits differ from PyTorch's by {measured:.4g} ({what}; allowed "
        f"{allowed:.4g}; largest |logit| {scale:.3g})"
    )
    return measured


def decided_prefix(llm: GGUFModel, model: torch.nn.Module, ids: list[int], expected: list[int]
                   ) -> int:  # fmt: skip
    """How many of PyTorch's greedy tokens ``expected`` after ``ids`` llama.cpp must reproduce:
    those before the first step where PyTorch's top two logits are closer than twice llama.cpp's
    largest difference from PyTorch on that row. There the tie is within float rounding, either
    token is right, and the two continuations may part."""
    full = ids + expected
    ours = torch_logits(model, full)[len(ids) - 1 : -1]
    theirs = llama_logits(llm, full)[len(ids) - 1 : -1]
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        top = a.topk(2).values
        if float(top[0] - top[1]) <= 2 * float((a - b).abs().max()):
            return step
    return len(expected)


def open_llama(path: Path) -> GGUFModel:
    pytest.importorskip("cyllama", reason="cyllama runs the GGUF export in llama.cpp")
    # An f32 KV cache (llama.cpp's default is f16) so that an f32 export is compared with
    # PyTorch at full precision: random tiny models have near ties that f16 rounding flips.
    return GGUFModel(path, n_ctx=256, n_threads=1, f32_cache=True)


# Per family, the config fields of a tiny model that exercise what the GGUF mapping must get right:
# a head size other than hidden/heads (Qwen3), sliding-window layers narrower than the prompts
# and local/global RoPE bases (Gemma), tied embeddings where llama.cpp wants an output layer of
# its own (OLMo 2).
#
# Gemma 3's tiny models have Gemma 3's own layout, five sliding-window layers to one global: the
# file says which layers slide (gemma3.attention.sliding_window_pattern), but the llama.cpp of the
# prebuilt cyllama wheel (b9190) ignores that key and assumes Gemma 3's fixed 5:1 pattern; given
# two layers, sliding and global, it took both as sliding and aborted the process in llama_decode
# (GGML_ASSERT(buffer): a global KV cache with no layer). llama-cpp-python 0.3.36 and xllamacpp
# (b11549) read the key.
GEMMA3_LAYERS = ["sliding_attention"] * 5 + ["full_attention"]
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
        "num_hidden_layers": len(GEMMA3_LAYERS),
        "layer_types": GEMMA3_LAYERS,
    },  # fmt: skip
    "gemma3": {
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "num_hidden_layers": len(GEMMA3_LAYERS),
        "layer_types": GEMMA3_LAYERS,
    },  # vision-language
    "phi3": {"tie_word_embeddings": False},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 128, "n_positions": 2048},
    "olmo2": {},
}
"""transformers model types of :func:`tiny_of`, with their config fields beyond TINY_CONFIG."""


def tiny_of(kind: str, tokenizer_dir: Path, out: Path, seed: int = 3, **fields: Any) -> Path:
    """A tiny random model of one of :data:`FAMILIES` with a given tokenizer, saved to ``out``;
    ``fields`` replace config fields of :data:`FAMILIES` (not for the vision-language gemma3).

    Norm weights and biases, which start at constants (zero for Gemma's norms and every bias),
    get random values too, so that a wrong offset, transpose or bias shows in the outputs.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    settings = {**TINY_CONFIG, "vocab_size": len(tokenizer), "initializer_range": 0.3,
                "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                "pad_token_id": tokenizer.pad_token_id, **FAMILIES[kind], **fields}  # fmt: skip
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
