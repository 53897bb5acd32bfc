"""A few GRPO steps with vLLM generating (a CUDA GPU, or vLLM's CPU build: `make test-vllm`),
against the same run on grpokit's torch engine.

The two engines draw different samples, so the runs are compared as samples of the same
process: the mean reward over the run within four standard errors of the difference, the
entropy close, and what must hold exactly in both (no KL and no clipping at the first step, every
completion the configured length). ``model.dtype: auto`` computes in bfloat16 on a CPU that has
it, and vLLM must then run in bfloat16 too, not in the float32 its ``auto`` reads from the
checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from grpokit.config import GRPOKitConfig
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.vllm_engine import VLLMEngine, vllm_available
from grpokit.train.forward import completion_logprobs, pack
from grpokit.train.trainer import GRPOTrainer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not vllm_available(),
        reason="needs vLLM (a CUDA GPU with grpokit[vllm], or vLLM's CPU build: make test-vllm)",
    ),
]
STEPS = 4


def _run(
    make_config: Callable[..., GRPOKitConfig], model_dir: Path, use_vllm: bool
) -> tuple[GRPOTrainer, list[dict[str, Any]]]:
    cfg = make_config(
        model={"name_or_path": str(model_dir), "dtype": "auto"},
        use_vllm=use_vllm,
        vllm_gpu_memory_utilization=0.05,
        per_device_train_batch_size=8,
        max_completion_length=16,
        max_steps=STEPS,
        beta=0.04,
        learning_rate=5e-3,  # moves the policy well past bfloat16's noise in 4 steps
    )
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    return trainer, trainer.train().history


def _mean_and_se(history: list[dict[str, Any]], completions_per_step: int) -> tuple[float, float]:
    """Mean reward over the run and its standard error (steps' spreads pooled)."""
    mean = sum(h["reward"] for h in history) / len(history)
    var = sum(h["reward_std"] ** 2 for h in history) / len(history)
    return mean, math.sqrt(var / (completions_per_step * len(history)))


def test_grpo_steps_on_vllm_match_the_torch_engine(
    make_config: Callable[..., GRPOKitConfig], vllm_tiny_model_dir: Path
) -> None:
    _, on_torch = _run(make_config, vllm_tiny_model_dir, use_vllm=False)
    trainer, on_vllm = _run(make_config, vllm_tiny_model_dir, use_vllm=True)
    engine = trainer.sampler.engine
    assert isinstance(engine, VLLMEngine)
    assert engine._llm.llm_engine.model_config.dtype == trainer.policy.compute_dtype

    assert len(on_vllm) == len(on_torch) == STEPS
    for run in (on_torch, on_vllm):
        assert run[0]["kl"] == 0.0 and run[0]["clip_ratio/region_mean"] == 0.0
        assert all(h["completions/mean_length"] == 16.0 for h in run)
        assert all(math.isfinite(h["loss"]) and h["grad_norm"] > 0 for h in run)
        assert run[-1]["kl"] > 0.0, "the policy moved away from the reference"
    per_step = trainer.args.generation_batch_size
    (m_t, se_t), (m_v, se_v) = _mean_and_se(on_torch, per_step), _mean_and_se(on_vllm, per_step)
    assert abs(m_t - m_v) < 4 * math.hypot(se_t, se_v), (m_t, m_v, se_t, se_v)
    entropy = [sum(h["entropy"] for h in run) / STEPS for run in (on_torch, on_vllm)]
    assert abs(entropy[0] - entropy[1]) < 0.1, entropy

    # vLLM generates from the trained policy: on its own samples, its log-probs agree with the
    # trainer's recomputation far better than with the starting weights' (the reference model).
    # Both are in bfloat16, whose rounding alone leaves a mean gap of a few hundredths.
    prompts = [[1, 2000, 300, 45, 7], [88, 99, 17]]
    batch = engine.generate(prompts, 8, SamplingParams(max_completion_length=16))
    rows = [prompts[i // 8] for i in range(len(batch))]
    tokens = pack(rows, batch.completion_ids, pad_token_id=trainer.policy.pad_token_id)
    vllm_logp = torch.nn.utils.rnn.pad_sequence(batch.logprobs, batch_first=True)
    mask = tokens.completion_mask[:, : vllm_logp.shape[1]]

    def gap(model: torch.nn.Module) -> float:
        with torch.no_grad():
            logp, _ = completion_logprobs(model, tokens)
        return float(((logp[:, : vllm_logp.shape[1]] - vllm_logp).abs() * mask).sum() / mask.sum())

    with trainer.policy.reference_model() as reference:
        start_gap = gap(reference)
    trained_gap = gap(trainer.policy.model)
    assert trained_gap < start_gap / 2, (trained_gap, start_gap)
