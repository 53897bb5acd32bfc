"""GRPO with ``model.dtype: auto`` on a CPU with native bfloat16: float32 master weights and
optimizer state, bfloat16 compute, and no clipping or KL faked by bfloat16 rounding (old, new and
reference log-probs come from the same computation, so on unchanged weights they are equal)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from grpokit.config import GRPOKitConfig
from grpokit.models.onednn import bf16_compute_applies
from grpokit.train.trainer import GRPOTrainer

pytestmark = pytest.mark.skipif(
    not bf16_compute_applies(torch.device("cpu")),
    reason="this CPU has no native bfloat16 (AVX512-BF16 or AMX) or this build no oneDNN",
)


@pytest.mark.parametrize(
    ("model", "mu"),
    [({}, 1), ({}, 2), ({"lora": {"r": 4, "alpha": 8}}, 2)],
    ids=["full-mu1", "full-mu2", "lora-mu2"],
)
def test_auto_dtype_trains_in_bf16_without_fake_clipping_or_kl(
    make_config: Callable[..., GRPOKitConfig], model: dict[str, Any], mu: int
) -> None:
    # A clip range far narrower than bfloat16's error on a log-prob (about 0.1 here): any
    # difference between the old and the new log-probs' computations would clip tokens.
    cfg = make_config(
        model={"dtype": "auto", **model},
        num_iterations=mu,
        max_steps=mu,
        beta=0.04,
        epsilon=1e-4,
    )
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    assert trainer.policy.compute_dtype == torch.bfloat16
    result = trainer.train()
    first = result.history[0]
    assert first["clip_ratio/region_mean"] == 0.0
    assert first["kl"] == 0.0  # the reference is the starting policy, computed the same way
    if mu == 2:  # after an update the ratio moves, and the narrow range clips: the metric works
        assert result.history[1]["clip_ratio/region_mean"] > 0.0
    policy = trainer.policy
    assert {p.dtype for p in policy.trainable_parameters()} == {torch.float32}
    frozen = {n: p.dtype for n, p in policy.model.named_parameters() if not p.requires_grad}
    if "lora" in model:  # the frozen base's linear weights as they are computed, the rest float32
        narrowed = {f"{name}.weight" for name in policy.narrowed}
        assert narrowed and all(n.endswith("base_layer.weight") for n in narrowed)
        assert {frozen[n] for n in narrowed} == {torch.bfloat16}
        assert {d for n, d in frozen.items() if n not in narrowed} == {torch.float32}
    else:
        assert not frozen and not policy.narrowed
    reference = policy.reference
    if "lora" not in model:  # the frozen copy keeps its linear weights as they are computed,
        assert reference is not None  # which is why the KL above is exactly 0
        linear = {m.weight.dtype for m in reference.modules() if isinstance(m, torch.nn.Linear)}
        assert linear == {torch.bfloat16}
        assert reference.get_input_embeddings().weight.dtype == torch.float32  # untied, float32
    states = [s for s in trainer.optimizer.state.values() if s]
    assert states and all(
        t.dtype == torch.float32 for s in states for k, t in s.items() if k != "step"
    )


QUESTIONS = [
    "What is 17 + 25? Answer with the number.",
    "Name three rivers in Europe.",
    "Write one sentence about the moon.",
    "Explain in one line what a prime number is.",
]


@pytest.mark.slow
def test_bf16_logprobs_on_the_embedded_model_agree_with_float32() -> None:
    """Per-token log-probs of the embedded SmolLM2-135M on its own sampled answers (4 prompts x 2
    samples of up to 48 tokens, about 280): bfloat16 against float32 measured at most 0.19, mean
    0.02-0.03; the bfloat16 rollout's own log-probs against the bfloat16 training forward at most
    0.26, mean 0.023 (two computations of the same bfloat16 policy, whose rounding differs; the
    rollout's log-probs are not used in the loss)."""
    from grpokit.data.chat import encode_prompt
    from grpokit.hub.embedded import EMBEDDED_MODEL
    from grpokit.models.loading import load_policy
    from grpokit.models.onednn import set_compute_dtype
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.torch_engine import TorchEngine
    from grpokit.train.forward import completion_logprobs, pack

    policy = load_policy(EMBEDDED_MODEL, dtype="auto", need_reference=False)
    model, tokenizer = policy.model, policy.tokenizer
    prompts = [encode_prompt(tokenizer, q) for q in QUESTIONS]
    pad = int(tokenizer.pad_token_id)
    engine = TorchEngine(model, eos_token_ids=policy.eos_token_ids(), pad_token_id=pad)
    params = SamplingParams(max_completion_length=48, temperature=1.0)
    rollout = engine.generate(prompts, 2, params, generator=torch.Generator().manual_seed(0))
    rows = range(len(rollout))
    expanded = [rollout.prompt_ids[rollout.prompt_index(row)] for row in rows]
    batch = pack(expanded, rollout.completion_ids, pad)
    mask = batch.completion_mask.bool()
    with torch.no_grad():
        bf16, _ = completion_logprobs(model, batch)
        set_compute_dtype(model, None)
        fp32, _ = completion_logprobs(model, batch)
    diff = (bf16 - fp32).abs()[mask]
    assert float(diff.max()) < 0.35 and float(diff.mean()) < 0.05
    sampled = torch.zeros_like(bf16)
    for row, logp in enumerate(rollout.logprobs):
        sampled[row, : len(logp)] = logp
    diff = (sampled - bf16).abs()[mask]
    assert float(diff.max()) < 0.35 and float(diff.mean()) < 0.05
