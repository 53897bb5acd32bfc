"""The static Llama-family decoder computes what transformers' forward computes, for every
architecture it accepts, with the layers' own weights, oneDNN-prepacked ones and the blocked
copies of grpokit's own float32 product, with its step's fused kernels and with the eager
operations they replace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from grpokit.models.loading import LoraSettings, load_policy
from grpokit.models.onednn import PackedLinear, onednn_available
from grpokit.native.decoders import (
    HFDecoder,
    PackCache,
    Packing,
    StaticLlamaDecoder,
    static_decoder_unsupported,
)
from grpokit.native.fused import BlockedLinear
from grpokit.native.graphs import GraphedSteps
from grpokit.rollout.torch_engine import left_pad, lora_merged

PROMPTS = [[5, 17, 300, 42, 9], [88, 99], [7, 8, 9, 10, 11, 12, 13]]
SMALL = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention, as in SmolLM2
    "max_position_embeddings": 128,
    "initializer_range": 0.3,  # context-dependent outputs (see test_torch_engine)
}
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama-rope-scaling": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 64}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),  # biased q/k/v projections
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),  # per-head q/k norms
}


def build(arch: str, seed: int = 0) -> torch.nn.Module:
    config_name, model_name, extra = ARCHITECTURES[arch]
    config = getattr(transformers, config_name)(**SMALL, **extra)
    torch.manual_seed(seed)
    model: torch.nn.Module = getattr(transformers, model_name)(config)
    if arch == "qwen2":  # random biases, so a missing bias would show
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.bias.normal_()
                layer.self_attn.k_proj.bias.normal_()
    return model.eval()


def full_forward_logits(model: torch.nn.Module, row: list[int]) -> torch.Tensor:
    """Next-token logits (len(row), V) of one unpadded sequence, no cache."""
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=torch.tensor([row])).logits[0]
    return logits


def decode(
    decoder: Any, steps: list[list[int]], n: int, fixed_from: int | None = None
) -> list[torch.Tensor]:
    """Logits after the prompts and after each forced token: [(P*n, V)] * (len(steps) + 1);
    from step ``fixed_from`` on with the decoder's fixed-shape steps (uncaptured)."""
    ids, mask, pos = left_pad(PROMPTS, 0, torch.device("cpu"))
    fixed = GraphedSteps(decoder, capture=False)
    with torch.inference_mode():
        out = [decoder.prefill(ids, mask, pos).repeat_interleave(n, dim=0)]
        decoder.expand(n)
        for t, tokens in enumerate(steps):
            step = fixed if fixed_from is not None and t >= fixed_from else decoder.step
            out.append(step(torch.tensor(tokens)))
    return out


def assert_follows_forward(
    model: torch.nn.Module,
    got: list[torch.Tensor],
    forced: list[list[int]],
    n: int,
    dtype: torch.dtype,
) -> None:
    """``got`` (as :func:`decode` returns it) at every row and step: in float32 the full
    forward's logits, in bfloat16 the autocast forward's within a total variation of 0.08."""
    for row in range(len(PROMPTS) * n):
        prompt = PROMPTS[row // n]
        tokens = prompt + [forced[t][row] for t in range(len(forced))]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            want = full_forward_logits(model, tokens)
        for t, logits in enumerate(got):
            at = len(prompt) - 1 + t
            if dtype == torch.float32:
                torch.testing.assert_close(logits[row], want[at], rtol=1e-4, atol=1e-4)
            else:
                assert _total_variation(logits[row], want[at]) < 0.08


FUSED = pytest.mark.parametrize("fused", [True, False], ids=["fused", "eager"])
PACKINGS = ["none", "onednn", "blocked"]


def static(model: torch.nn.Module, steps: int, fused: bool, **kwargs: Any) -> StaticLlamaDecoder:
    with torch.inference_mode():  # as the engine builds it
        decoder = StaticLlamaDecoder(model, steps, fused=fused, **kwargs)
    assert (decoder.kernels is not None) == fused  # the fused kernels build on every test machine
    return decoder


@FUSED
@pytest.mark.parametrize("pack", PACKINGS)
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_static_decoder_equals_full_forward(arch: str, pack: Packing, fused: bool) -> None:
    if pack == "onednn" and not onednn_available():
        pytest.skip("this PyTorch build has no oneDNN")
    model = build(arch)
    assert static_decoder_unsupported(model, 30) is None
    n, forced = 2, [[3, 4, 5, 6, 7, 8], [40, 41, 42, 43, 44, 45], [90, 91, 92, 93, 94, 95]]
    # forced[t][row]: the token appended at step t to each of the P * n rows
    decoder = static(model, len(forced), fused, pack=pack)
    kind = {"none": torch.nn.Linear, "onednn": PackedLinear, "blocked": BlockedLinear}[pack]
    assert isinstance(decoder.lm_head.fused, kind)
    assert pack == "none" or isinstance(decoder.layers[0].qkv.fused, kind)  # q, k, v as one
    got = decode(decoder, forced, n)
    for row in range(len(PROMPTS) * n):
        prompt = PROMPTS[row // n]
        want = full_forward_logits(model, prompt + [forced[t][row] for t in range(len(forced))])
        for t, logits in enumerate(got):
            torch.testing.assert_close(logits[row], want[len(prompt) - 1 + t], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_fixed_steps_equal_full_forward(arch: str, dtype: torch.dtype) -> None:
    """The fixed-shape step a CUDA graph replays (grpokit.native.graphs), run here uncaptured
    after an ordinary step, in the operations and layout of the decoder on a GPU: in float32
    the logits of the full forward, in bfloat16 those of the autocast forward within the
    tolerance of the bfloat16 tests below, for every architecture; the cache column it writes
    is the one the ordinary steps would have."""
    model = build(arch)
    n, forced = 2, [[3, 4, 5, 6, 7, 8], [40, 41, 42, 43, 44, 45], [90, 91, 92, 93, 94, 95]]
    decoder = static(model, len(forced), False, pack="none", dtype=dtype)
    got = decode(decoder, forced, n, fixed_from=1)
    width = max(len(p) for p in PROMPTS)
    assert decoder.column == int(decoder.column_index) == width + len(forced)
    assert_follows_forward(model, got, forced, n, dtype)


def test_select_keeps_rows_and_matches_hf_decoder() -> None:
    model = build("llama", seed=3)
    decoders = [
        static(model, 4, True, pack="none"),
        static(model, 4, False, pack="blocked"),
        HFDecoder(model),
    ]
    keep = torch.tensor([0, 2, 5])
    results = []
    for decoder in decoders:
        first = decode(decoder, [[1, 2, 3, 4, 5, 6]], 2)
        with torch.inference_mode():
            decoder.select(keep)
            results.append([*first, decoder.step(torch.tensor([7, 8, 9]))])
    for a, b, c in zip(*results, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-4)
    assert results[0][-1].shape[0] == len(keep)


def with_lora(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with a plain LoRA adapter on every linear layer but the head (ranks 2 and 4,
    scaling 1.5 and 3) whose B is random, so that the adapter changes every output."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=6, rank_pattern={"q_proj": 2}, target_modules="all-linear")
    peft_model = get_peft_model(model, config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    return peft_model.eval()


@FUSED
@pytest.mark.parametrize("merge", [False, True], ids=["unmerged", "merged"])
@pytest.mark.parametrize("pack", PACKINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_lora_decodes_as_peft_computes(
    pack: Packing, fused: bool, dtype: torch.dtype, merge: bool
) -> None:
    """A LoRA policy decodes with its adapter computed beside the base products, or merged into a
    copy of the weights: in float32 what peft's forward computes; in bfloat16 within the
    tolerance of the autocast test below. The policy's weights are untouched, and a second
    decoder built from the same pack cache reads the adapter afresh and, unmerged, reuses the
    frozen base's packed copies."""
    if (pack != "none" or dtype == torch.bfloat16) and not onednn_available():
        pytest.skip("this PyTorch build has no oneDNN")
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no oneDNN bfloat16 kernels")
    model = with_lora(build("qwen2"))  # biased q/k/v: the bias stays in the base product
    n, forced = 2, [[3, 4, 5, 6, 7, 8], [40, 41, 42, 43, 44, 45]]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    cache = PackCache()
    options = {"pack": pack, "dtype": dtype, "pack_cache": cache, "merge_lora": merge}
    first = static(model, len(forced), fused, **options)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(-1)  # a trained adapter: the next rollout must see it
    second = static(model, len(forced), fused, **options)
    got = decode(second, forced, n)
    if pack != "none":  # unmerged, the frozen base's packed copy is kept
        assert (second.layers[0].qkv.fused is first.layers[0].qkv.fused) == (not merge)
    assert second.layers[0].qkv.lora.empty == merge
    unchanged = [torch.equal(v, model.state_dict()[k]) for k, v in weights.items() if "B" not in k]
    assert all(unchanged)
    assert_follows_forward(model, got, forced, n, dtype)


@FUSED
@pytest.mark.parametrize("pack", PACKINGS)
def test_reference_rows_decode_the_base_beside_the_policy(pack: Packing, fused: bool) -> None:
    """With ``reference``, each call's logits are the LoRA policy's and ``reference_logits`` its
    base's (the adapter off) at the same positions, for the same tokens, also after rows are
    dropped: both what peft's forward computes, in float32."""
    if pack == "onednn" and not onednn_available():
        pytest.skip("this PyTorch build has no oneDNN")
    model = with_lora(build("qwen2"))
    n, forced = 2, [[3, 4, 5, 6, 7, 8], [40, 41, 42, 43, 44, 45], [90, 91, 92]]
    keep = torch.tensor([0, 3, 5])  # the rows left for the last step
    decoder = static(model, len(forced), fused, pack=pack, reference=True)
    ids, mask, pos = left_pad(PROMPTS, 0, torch.device("cpu"))
    rows = torch.arange(len(PROMPTS) * n)
    got: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (rows, policy, reference)
    with torch.inference_mode():
        policy = decoder.prefill(ids, mask, pos)
        assert decoder.reference_logits is not None
        got.append(
            (rows, policy.repeat_interleave(n, 0), decoder.reference_logits.repeat_interleave(n, 0))
        )
        decoder.expand(n)
        for t, tokens in enumerate(forced):
            if t == len(forced) - 1:
                decoder.select(keep)
                rows = rows[keep]
            policy = decoder.step(torch.tensor(tokens))
            got.append((rows, policy, decoder.reference_logits))
    for adapter_on in (True, False):
        for row in range(len(PROMPTS) * n):
            prompt = PROMPTS[row // n]
            steps = [t for t in range(len(forced)) if row in got[t + 1][0].tolist()]
            seen = [forced[t][got[t + 1][0].tolist().index(row)] for t in steps]
            if adapter_on:
                want = full_forward_logits(model, prompt + seen)
            else:
                with model.disable_adapter():
                    want = full_forward_logits(model, prompt + seen)
            for t, (at_rows, policy, reference) in enumerate(got):
                if row not in at_rows.tolist():
                    continue
                logits = (policy if adapter_on else reference)[at_rows.tolist().index(row)]
                torch.testing.assert_close(logits, want[len(prompt) - 1 + t], rtol=1e-4, atol=1e-4)


def test_unsupported_models_are_named(tiny_model_dir: Path) -> None:
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    )
    assert "gpt2" in str(static_decoder_unsupported(gpt2, 10))
    mistral = build("mistral")  # sliding window 64
    assert static_decoder_unsupported(mistral, 64) is None
    assert "sliding window" in str(static_decoder_unsupported(mistral, 65))
    policy = load_policy(
        str(tiny_model_dir), lora=LoraSettings(r=2, alpha=4.0), need_reference=False
    )
    assert static_decoder_unsupported(policy.model, 10) is None  # plain LoRA: merged by copy
    with lora_merged(policy.model):
        assert static_decoder_unsupported(policy.model, 10) is None


def _total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest total-variation distance between the rows' next-token distributions."""
    diff = a.float().softmax(-1) - b.float().softmax(-1)
    return float(diff.abs().sum(-1).max()) / 2


needs_bf16 = pytest.mark.skipif(
    not (onednn_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU or PyTorch build has no oneDNN bfloat16 kernels",
)


@needs_bf16
@FUSED
@pytest.mark.parametrize("pack", ["none", "onednn"])  # "blocked" packs bfloat16 for oneDNN
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_bf16_static_decoder_follows_the_autocast_forward(
    arch: str, pack: Packing, fused: bool
) -> None:
    """Decoding in bfloat16 computes, to bfloat16 rounding, what the training forward computes
    under autocast; the transformers decoder under autocast is that forward exactly. Measured on
    these wide random models: total variation at most 0.030 from the autocast forward and 0.048
    from float32 (0.051 between the autocast forward and float32 itself)."""
    model = build(arch)
    n, forced = 2, [[3, 4, 5, 6, 7, 8], [40, 41, 42, 43, 44, 45], [90, 91, 92, 93, 94, 95]]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    ours16 = decode(static(model, len(forced), fused, pack=pack, dtype=torch.bfloat16), forced, n)
    hf = decode(HFDecoder(model, dtype=torch.bfloat16), forced, n)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    for row in range(len(PROMPTS) * n):
        prompt = PROMPTS[row // n]
        tokens = prompt + [forced[t][row] for t in range(len(forced))]
        want32 = full_forward_logits(model, tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want16 = full_forward_logits(model, tokens)
        for t, (ours, theirs) in enumerate(zip(ours16, hf, strict=True)):
            at = len(prompt) - 1 + t
            assert ours.dtype == torch.float32
            assert _total_variation(ours[row], want16[at]) < 0.08
            assert _total_variation(ours[row], want32[at]) < 0.1
            torch.testing.assert_close(theirs[row].float(), want16[at].float())
