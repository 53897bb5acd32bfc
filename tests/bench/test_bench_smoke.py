"""The benchmarks still run: each script with --smoke on the tiny model, checking the ratios block.

They measure nothing here (a tiny random model on a shared machine); they only keep the scripts
from rotting. TRL is a dev dependency, so the training-step benchmark runs its real peer. Each
starts a process that imports torch, transformers and often TRL (5-33 s): all are slow tests,
which CI runs (`make test-slow`; the vLLM ones in `make test-vllm`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpokit.models.onednn import bf16_compute_applies
from grpokit.native.heuristics import blocked_products_pay
from grpokit.rollout.vllm_engine import vllm_available

BENCH = Path(__file__).resolve().parents[2] / "bench"
RATIO_LINE = re.compile(r"^(.+?)\s+(\d+\.\d+)x\s", re.M)


def _run(script: str, *extra: str, timeout: float = 600) -> dict[str, float]:
    """The ratios block's lines, name -> the ratio (the median of paired repeats where paired)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke", "--threads", "1", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tail = proc.stdout.split("\n== ")[-1]  # the ratios come last
    ratios = {m.group(1).strip(): float(m.group(2)) for m in RATIO_LINE.finditer(tail)}
    assert ratios, proc.stdout[-3000:]
    assert "load average" in tail.splitlines()[0]
    return ratios


@pytest.mark.slow  # 33 s, the slowest of the default run on a Zen 2 core
def test_rollout_benchmark_prints_its_ratios() -> None:
    ratios = _run("rollout.py", "--batch-sizes", "8")
    want = {
        "batch 8: grpokit / generate tokens per second",
        "batch 8: grpokit / generate-onednn",
        "batch 8: grpokit / decode floor (torch default)",
        "batch 8: grpokit / decode floor (oneDNN linears)",
        "batch 8: grpokit / its eager step",  # the fused decode kernels off
    }
    bf16 = bf16_compute_applies(torch.device("cpu"))
    if bf16:  # bfloat16 against the float32 engine
        want.add("batch 8: grpokit bfloat16 / float32 tokens per second")
    elif blocked_products_pay():  # the blocked float32 product against oneDNN's
        want.add("batch 8: grpokit / grpokit-onednn")
    if vllm_available():  # vLLM's CPU build (make test-vllm): its engine is a peer, each dtype
        want.add("batch 8: grpokit / vllm tokens per second")
        if bf16:
            want.add("batch 8: grpokit-fp32 / vllm-fp32 tokens per second")
        else:  # grpokit in float32, vLLM also in bfloat16
            want.add("batch 8: grpokit / vllm-bf16 tokens per second")
    assert set(ratios) == want
    assert all(v > 0 for v in ratios.values())


needs_vllm = pytest.mark.skipif(not vllm_available(), reason="needs vLLM (make test-vllm)")


@pytest.mark.slow
@needs_vllm
def test_lora_sync_benchmark_prints_its_ratios() -> None:
    assert set(_run("lora_sync.py", timeout=1500)) == {
        "merged / adapter seconds per sync",
        "adapter / merged rollout tokens per second",
    }


@pytest.mark.slow
@needs_vllm
def test_async_rollouts_benchmark_prints_its_ratio() -> None:
    # A vLLM server's start alone took over 300 s on the shared 2-core machine under load.
    assert set(_run("async_rollouts.py", timeout=1500)) == {"synchronous / ahead seconds per step"}


@pytest.mark.slow
def test_training_step_benchmark_against_trl_prints_its_ratios() -> None:
    pytest.importorskip("trl")
    ratios = _run("train_step.py")
    assert set(ratios) == {
        "full-beta0.04: grpokit / TRL seconds per step",
        "full-beta0.04: grpokit / TRL peak memory",
    }


@pytest.mark.slow
def test_scaling_benchmark_prints_its_ratios() -> None:
    ratios = _run("scaling.py")
    assert len(ratios) == 3  # a 2 x 2 grid against its first point


@pytest.mark.slow
def test_scaling_benchmark_measures_log_prob_memory() -> None:
    ratios = _run("scaling.py", "--memory")
    assert set(ratios) == {"L 64: chunk 16 / all at once, memory above the model"}
    assert all(v > 0 for v in ratios.values())


@pytest.mark.slow
def test_scaling_benchmark_against_trl_prints_its_ratios() -> None:
    pytest.importorskip("trl")
    ratios = _run("scaling.py", "--vs-trl")
    assert set(ratios) == {
        "L 8: grpokit / TRL seconds per step",
        "L 8: grpokit / TRL peak memory",
    }
    assert all(v > 0 for v in ratios.values())


@pytest.mark.slow
def test_memory_benchmark_compares_the_memory_settings() -> None:
    ratios = _run("memory.py")
    assert set(ratios) == {"L 8: lean / default, peak memory"}


@pytest.mark.slow
def test_scaling_benchmark_compares_padded_and_packed() -> None:
    ratios = _run("scaling.py", "--packing")
    assert set(ratios) == {
        "L 16: packed / padded seconds",
        "L 16: packed / padded-plain seconds",
    }
    assert all(v > 0 for v in ratios.values())


@pytest.mark.slow
def test_log_softmax_benchmark_against_torch_and_trl() -> None:
    ratios = _run("logsoftmax.py")
    assert set(ratios) == {
        f"{measure}: grpokit / {peer}"
        for measure in ("log-probs", "entropy", "forward + backward")
        for peer in ("TRL", "its torch operations")
    }
    assert all(v > 0 for v in ratios.values())


@pytest.mark.slow
def test_judge_order_benchmark_prints_its_ratio() -> None:
    """Two answers of the recipe asked of the embedded model in both orders, once; the script
    itself stops when the two orders' P(yes) differ beyond rounding."""
    ratios = _run("judge_order.py", timeout=600)
    assert set(ratios) == {"time of a pass, item-major / completion-major"}
    assert all(v > 0 for v in ratios.values())
