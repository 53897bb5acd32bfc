"""bench/gpu_check.sh keeps working where there is no GPU: its --cpu-smoke mode runs the same code
path on a tiny model (both libraries, LoRA and full fine-tuning, a checkpoint and a resume), and
the wheels it carries to an offline GPU machine are worked out from the installed metadata."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
RUN_LINE = re.compile(
    r"^tiny\s+(?P<setting>\S+)\s+(?P<lib>grpokit|trl)\s+(?P<step>\d+\.\d+) s/step\s+"
    r"(?P<tokens>\d+) tokens/s\s+peak RSS\s+(?P<mem>\d+\.\d+) GiB\s+completion (?P<len>\d+\.\d+)",
    re.M,
)
RESUME_LINE = re.compile(r"checkpoint-(\d+) written in .*; resumed at step (\d+) .*, step (\d+) in")
PHASE_LINE = re.compile(
    r"^\s+generate (\d+\.\d+) s, score (\d+\.\d+) s, update (\d+\.\d+) s$", re.M
)
PEAK_LINE = re.compile(r"^\s+peak RSS in collect (\d+\.\d+) GiB, update (\d+\.\d+) GiB$", re.M)
ROLLOUT_LINE = re.compile(
    r"^tiny\s+rollout 8 tokens: ordinary steps (?P<ordinary>\d+\.\d+) s, fixed steps "
    r"\(uncaptured\) (?P<fixed>\d+\.\d+) s .*trainer forward\| (?P<d_ordinary>\S+) / "
    r"(?P<d_fixed>\S+); rows decoded alike (?P<alike>\d+) of (?P<rows>\d+)$",
    re.M,
)
RATIO_LINE = re.compile(r"^tiny (\S+): grpokit / TRL (.+?)\s+(\d+\.\d+)x", re.M)


def _gpu_check(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """bench/gpu_check.sh ARGS with this interpreter, one thread."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        ["bash", str(BENCH / "gpu_check.sh"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_cpu_smoke_prints_both_libraries_and_a_resume() -> None:
    pytest.importorskip("trl")
    proc = _gpu_check("--cpu-smoke", "--threads", "1", timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "the packages the check imports are installed" in out

    runs = {(m["setting"], m["lib"]): m for m in RUN_LINE.finditer(out)}
    settings = ("lora-beta0.04", "full-beta0.04")
    assert set(runs) == {(s, lib) for s in settings for lib in ("grpokit", "trl")}, out
    for m in runs.values():
        assert float(m["step"]) > 0 and int(m["tokens"]) > 0 and float(m["mem"]) > 0
        assert float(m["len"]) == 8.0  # end tokens suppressed: every completion runs to the end

    resumes = [tuple(map(int, r)) for r in RESUME_LINE.findall(out)]
    assert resumes == [(2, 2, 3), (2, 2, 3)]  # saved at 2, resumed at 2, went on to step 3
    # grpokit's phases, from its step log: parts of the step, so they add up to at most its time
    phases = [tuple(map(float, p)) for p in PHASE_LINE.findall(out)]
    assert len(phases) == len(settings), out
    for setting, parts in zip(settings, phases, strict=True):
        assert all(t >= 0 for t in parts) and sum(parts) > 0
        assert sum(parts) <= float(runs[(setting, "grpokit")]["step"]) + 0.02  # printed rounded
    # the peak of each phase, each at most the run's peak, which one of them (or loading) sets
    peaks = [tuple(map(float, p)) for p in PEAK_LINE.findall(out)]
    assert len(peaks) == len(settings), out
    for setting, parts in zip(settings, peaks, strict=True):
        assert all(0 < m <= float(runs[(setting, "grpokit")]["mem"]) + 0.005 for m in parts)

    ratios = {
        (s, what): float(v)
        for s, what, v in RATIO_LINE.findall(
            out.split("\n== GPU check ratios")[-1].split("\n== ")[0]
        )
    }
    assert set(ratios) == {
        (s, what)
        for s in settings
        for what in ("seconds per step", "tokens per second", "peak RSS memory")
    }
    assert all(v > 0 for v in ratios.values())
    assert out.count("same tokens") == len(settings)

    # the rollouts with ordinary and fixed-shape steps (uncaptured on the CPU): both as close to
    # the trainer's forward as float32 allows, the same greedy tokens in every row
    rollout = ROLLOUT_LINE.search(out)
    assert rollout is not None, out
    assert float(rollout["ordinary"]) > 0 and float(rollout["fixed"]) > 0
    assert float(rollout["d_ordinary"]) < 1e-4 and float(rollout["d_fixed"]) < 1e-4
    assert rollout["alike"] == rollout["rows"] == "4"


def test_wheels_folder_holds_what_a_torch_machine_lacks() -> None:
    pytest.importorskip("trl")
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))

    assert gpu_check.missing_requirements() == []  # this environment has everything
    names = {gpu_check._requirement(r).name.lower() for r in gpu_check.requirements()}
    assert names == gpu_check.CHECK_PACKAGES
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = gpu_check.wheels_needed(gpu_check.ASSUMED, version)
    assert {"pydantic", "pydantic-core", "math-verify", "trl", "datasets"} <= set(wheels)
    assert not {"torch", "transformers", "peft", "numpy", "tokenizers"} & set(wheels)
    everything = gpu_check.wheels_needed([], version)
    assert {"transformers", "peft", "numpy"} <= set(everything) and "torch" not in everything


VLLM_LINE = re.compile(
    r"^tiny\s+(?P<sync>merged|adapter)\s+\S+B .*first sync\s+(?P<first>\d+\.\d+) s; sync "
    r"(?P<sync_s>\d+\.\d+) .*; (?P<rate>\d+) \(.*tokens/s",
    re.M,
)


@pytest.mark.slow
def test_vllm_cpu_smoke_runs_the_gpu_vllm_path() -> None:
    """bench/gpu_check.sh --vllm on vLLM's CPU build: the code the GPU runs (a model without
    weights, vLLM from random weights, both LoRA syncs, the report) on a tiny model; sleep mode
    is the one part left to the GPU."""
    from grpokit.rollout.vllm_engine import vllm_available

    if not vllm_available():
        pytest.skip("needs vLLM (make test-vllm)")
    proc = _gpu_check("--vllm", "--cpu-smoke", timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    runs = {m["sync"]: m for m in VLLM_LINE.finditer(out)}
    assert set(runs) == {"merged", "adapter"}, out
    assert all(float(m["sync_s"]) > 0 and int(m["rate"]) > 0 for m in runs.values())
    assert "tiny: adapter / merged tokens per second" in out.split("\n== ")[-1]
