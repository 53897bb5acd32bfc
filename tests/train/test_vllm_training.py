"""A few GRPO steps with vLLM generating (a CUDA GPU, or vLLM's CPU build: `make test-vllm`),
against the same run on grpokit's torch engine; and with vLLM's own server generating, its
weights pushed as files (no NCCL), following the policy, on-policy and one step ahead.

The two engines draw different samples, so the runs are compared as samples of the same
process: the mean reward over the run within four standard errors of the difference, the
entropy close, and what must hold exactly in both (no KL and no clipping at the first step, every
completion the configured length). ``model.dtype: auto`` computes in bfloat16 on a CPU that has
it, and vLLM must then run in bfloat16 too, not in the float32 its ``auto`` reads from the
checkpoint.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpokit.config import GRPOKitConfig
from grpokit.rollout.ahead import AheadEngine
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.vllm_engine import VLLMEngine, _free_port, vllm_available
from grpokit.rollout.vllm_server import start_server
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
    make_config: Callable[..., GRPOKitConfig],
    model_dir: Path,
    use_vllm: bool,
    dtype: str = "auto",
    **training: Any,
) -> tuple[GRPOTrainer, list[dict[str, Any]]]:
    settings: dict[str, Any] = {
        "use_vllm": use_vllm,
        "vllm_gpu_memory_utilization": 0.05,
        "per_device_train_batch_size": 8,
        "max_completion_length": 16,
        "max_steps": STEPS,
        "beta": 0.04,
        "learning_rate": 5e-3,  # moves the policy well past bfloat16's noise in 4 steps
    }
    cfg = make_config(
        model={"name_or_path": str(model_dir), "dtype": dtype}, **(settings | training)
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
    per_step = trainer.args.completions_per_generation
    (m_t, se_t), (m_v, se_v) = _mean_and_se(on_torch, per_step), _mean_and_se(on_vllm, per_step)
    assert abs(m_t - m_v) < 4 * math.hypot(se_t, se_v), (m_t, m_v, se_t, se_v)
    entropy = [sum(h["entropy"] for h in run) / STEPS for run in (on_torch, on_vllm)]
    assert abs(entropy[0] - entropy[1]) < 0.1, entropy

    # vLLM generates from the trained policy: on its own samples, its log-probs agree with the
    # trainer's recomputation far better than with the starting weights' (the reference model).
    # Both are in bfloat16, whose rounding alone leaves a mean gap of a few hundredths.
    trained_gap, start_gap = _gaps(trainer)
    assert trained_gap < start_gap / 2, (trained_gap, start_gap)


def _gaps(trainer: GRPOTrainer) -> tuple[float, float]:
    """Mean |log-prob gap| per token between vLLM (sampling 2 prompts x 8 from the trainer's
    engine) and the trainer's recomputation: under the trained policy, and under the reference
    (the starting weights)."""
    engine = trainer.sampler.engine
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
    return gap(trainer.policy.model), start_gap


@pytest.fixture(scope="module")
def vllm_server_url(
    vllm_tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """vLLM's OpenAI-compatible server on the tiny model, in float32, started by
    `grpokit vllm-serve`."""
    port = _free_port()
    cmd = [sys.executable, "-m", "grpokit", "vllm-serve", "--model", str(vllm_tiny_model_dir)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    cmd += ["--memory-share", "0.05", "--max-model-len", "256", "--max-num-seqs", "64"]
    # A generous wait: on a shared 2-core machine under load the start took over 300 s.
    proc = start_server(cmd, log=tmp_path_factory.mktemp("vllm-server") / "server.log", timeout=900)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU trainer pushes weights over NCCL")
def test_grpo_steps_on_a_vllm_server_without_nccl(
    make_config: Callable[..., GRPOKitConfig], vllm_tiny_model_dir: Path, vllm_server_url: str
) -> None:
    """The server is started, the trainer pushes its weights as a file at start and after each of
    3 steps, and the server's log-probs then follow the trained policy (float32 on both sides:
    within 1e-3 per token on average), not the starting weights."""
    trainer, history = _on_server(make_config, vllm_tiny_model_dir, vllm_server_url, max_steps=3)
    assert len(history) == 3 and history[-1]["kl"] > 0.0
    _assert_server_follows(trainer)


def _on_server(
    make_config: Callable[..., GRPOKitConfig], model_dir: Path, url: str, **training: Any
) -> tuple[GRPOTrainer, list[dict[str, Any]]]:
    """A float32 run generating on the server at ``url``."""
    return _run(
        make_config,
        model_dir,
        use_vllm=True,
        dtype="float32",
        vllm_mode="server",
        vllm_server_base_url=url,
        **({"learning_rate": 1e-2} | training),
    )


def _assert_server_follows(trainer: GRPOTrainer) -> None:
    """The server's log-probs follow the trained policy (float32 on both sides: within 1e-3 per
    token on average), not the starting weights."""
    trained_gap, start_gap = _gaps(trainer)
    assert trained_gap < 1e-3, trained_gap
    assert start_gap > 20 * trained_gap, (trained_gap, start_gap)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU trainer pushes weights over NCCL")
def test_generating_one_step_ahead_on_a_vllm_server(
    make_config: Callable[..., GRPOKitConfig], vllm_tiny_model_dir: Path, vllm_server_url: str
) -> None:
    """max_staleness: 1: each step's completions were sampled while the step before trained, by
    the weights before that step's update. The first step has nothing to overlap (staleness 0),
    every later one trains one update off-policy; the mismatch correction sees that gap (float32
    on both sides, so beyond rounding it is the staleness alone); the server ends on the trained
    weights all the same."""
    trainer, history = _on_server(
        make_config, vllm_tiny_model_dir, vllm_server_url, max_staleness=1
    )
    assert isinstance(trainer.engine, AheadEngine)
    assert [h["staleness"] for h in history] == [0.0, 1.0, 1.0, 1.0]
    assert all(math.isfinite(h["loss"]) and h["grad_norm"] > 0 for h in history)
    on_policy = history[0]["mismatch/kl"]
    assert on_policy < 1e-6, on_policy  # float32 server against the float32 trainer
    assert all(h["mismatch/kl"] > 10 * on_policy for h in history[1:]), history
    assert trainer.engine.weight_version == STEPS  # a push after every step
    _assert_server_follows(trainer)
