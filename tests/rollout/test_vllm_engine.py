"""The vLLM engine: weight naming and LoRA merging everywhere; generation where CUDA and vLLM are.

The weight sync is the part that can silently go wrong (a misnamed tensor is skipped or loaded
into the wrong place), so the names and merged values are checked on CPU against peft's own merge,
without vLLM. Generation and sync through a real vLLM run only on a CUDA machine with vllm.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpokit.errors import UserError
from grpokit.models.loading import LoraSettings, load_policy
from grpokit.rollout.base import RolloutEngine, SamplingParams
from grpokit.rollout.torch_engine import TorchEngine
from grpokit.rollout.vllm_engine import (
    VLLMEngine,
    dense_weights,
    finish_reason,
    merged_adapter,
    vllm_available,
    vllm_param_name,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_gpu_vllm = pytest.mark.skipif(
    not vllm_available(),
    reason="needs a CUDA GPU and the vllm package (pip install 'grpokit[vllm]'); "
    f"here: cuda={torch.cuda.is_available()}, vllm={HAS_VLLM}",
)
EOS = 2


def test_names_map_to_the_dense_model() -> None:
    assert vllm_param_name("base_model.model.model.layers.0.mlp.up_proj.base_layer.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert (
        vllm_param_name("base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight") is None
    )
    assert vllm_param_name("base_model.model.lm_head.modules_to_save.default.weight") == (
        "lm_head.weight"
    )
    assert vllm_param_name("base_model.model.lm_head.original_module.weight") is None
    assert vllm_param_name("model.norm.weight") == "model.norm.weight"


def test_lora_sync_sends_the_merged_dense_weights(tiny_model_dir: Path) -> None:
    """What sync_weights would send for a LoRA policy = the merged model's own state dict."""
    policy = load_policy(
        str(tiny_model_dir),
        lora=LoraSettings(r=4, alpha=8),
        need_reference=False,
        device=torch.device("cpu"),
    )
    model = policy.model
    with torch.no_grad():  # a non-zero adapter, so merging changes the weights
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with merged_adapter(model) as merged:
        sent = {n: t.clone() for n, t in dense_weights(merged)}
    # The adapter is unmerged afterwards: training continues on the unchanged parameters.
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), before[n])

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    expected_names = {n for n, _ in plain.named_parameters()}
    assert set(sent) == expected_names
    # peft's merge of a copy gives the values vLLM must receive.
    reference = copy.deepcopy(model).merge_and_unload()
    for name, value in reference.named_parameters():
        torch.testing.assert_close(sent[name], value.detach(), rtol=1e-6, atol=1e-6)
    changed = [n for n in sent if not torch.equal(sent[n], dict(plain.named_parameters())[n])]
    assert any("q_proj" in n for n in changed), "the merged LoRA delta must reach vLLM"


def test_finish_reason_from_the_last_token() -> None:
    assert finish_reason([5, 6, EOS], {EOS}) == "eos"
    assert finish_reason([5, 6, 7], {EOS}) == "length"
    assert finish_reason([], {EOS}) == "length"


@pytest.mark.skipif(HAS_VLLM and torch.cuda.is_available(), reason="vLLM is usable here")
def test_a_clear_error_without_vllm_or_cuda(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(UserError, match="vllm|CUDA"):
        VLLMEngine(model, model_path=str(tiny_model_dir), eos_token_ids=[EOS])


@needs_gpu_vllm
def test_colocated_generation_and_weight_sync(tiny_model_factory) -> None:  # type: ignore[no-untyped-def]
    path = tiny_model_factory(seed=1, initializer_range=0.3)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    engine = VLLMEngine(
        model,
        model_path=str(path),
        eos_token_ids=[EOS],
        gpu_memory_utilization=0.2,
        dtype="float32",
    )
    assert isinstance(engine, RolloutEngine)
    prompts = [[1, 2000, 300, 45, 7], [88, 99, 17]]
    greedy = SamplingParams(max_completion_length=12, temperature=0.0)
    batch = engine.generate(prompts, 3, greedy)
    assert len(batch) == 6 and batch.group_size == 3
    assert all(
        len(c) == len(lp) for c, lp in zip(batch.completion_ids, batch.logprobs, strict=True)
    )
    # Greedy vLLM equals greedy torch on the same weights (float32, short completions).
    reference = TorchEngine(model, eos_token_ids=[EOS], pad_token_id=EOS).generate(
        prompts, 1, greedy
    )
    assert [batch.completion_ids[0], batch.completion_ids[3]] == reference.completion_ids

    with torch.no_grad():  # a different policy: sync must change what vLLM generates
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    engine.sync_weights()
    after = engine.generate(prompts, 1, greedy)
    moved = TorchEngine(model, eos_token_ids=[EOS], pad_token_id=EOS).generate(prompts, 1, greedy)
    assert after.completion_ids == moved.completion_ids
    assert after.completion_ids != reference.completion_ids

    sampled = engine.generate(prompts, 4, SamplingParams(max_completion_length=12))
    assert len({tuple(c) for c in sampled.completion_ids[:4]}) > 1, "samples of a group differ"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_engine_decodes_lora_merged_and_restores_the_weights(
    tiny_model_dir: Path, dtype: str
) -> None:
    """Merging for decoding changes no log-prob beyond rounding and leaves the weights as they were
    (bit for bit in 16-bit dtypes; within float32 rounding otherwise)."""
    policy = load_policy(
        str(tiny_model_dir),
        dtype=dtype,  # type: ignore[arg-type]
        lora=LoraSettings(r=4, alpha=8),
        need_reference=False,
        device=torch.device("cpu"),
    )
    model = policy.model
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = TorchEngine(model, eos_token_ids=[EOS], pad_token_id=EOS)
    batch = engine.generate(
        [[1, 2000, 300, 45, 7]], 2, SamplingParams(max_completion_length=6, temperature=0.0)
    )
    assert not any(getattr(m, "merged", False) for m in model.modules())
    for n, p in model.named_parameters():
        if dtype == "bfloat16":
            assert torch.equal(p.detach(), before[n]), n
        else:
            torch.testing.assert_close(p.detach(), before[n], rtol=0, atol=1e-6)
    # The sampled tokens' log-probs under the unmerged adapter (the trained policy).
    ids = torch.tensor([[1, 2000, 300, 45, 7, *batch.completion_ids[0]]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, 4:-1].float()
    recomputed = logits.log_softmax(-1).gather(-1, ids[0, 5:, None]).squeeze(-1)
    tol = 5e-2 if dtype == "bfloat16" else 1e-4
    torch.testing.assert_close(batch.logprobs[0], recomputed, rtol=0, atol=tol)
