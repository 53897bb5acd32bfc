"""bench/gpu_check.sh keeps working where there is no GPU: its --cpu-smoke mode runs the same code
path on a tiny model (both libraries, LoRA and full fine-tuning, a checkpoint and a resume), and
the wheels it carries to an offline GPU machine are worked out from the installed metadata."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
RUN_LINE = re.compile(
    r"^(?P<model>tiny|tiny-qwen2)\s+(?P<setting>\S+)\s+(?P<lib>grpokit|trl)\s+(?P<step>\d+\.\d+) "
    r"s/step\s+(?P<tokens>\d+) tokens/s\s+peak RSS\s+(?P<mem>\d+\.\d+) GiB\s+completion "
    r"(?P<len>\d+\.\d+)",
    re.M,
)
RESUME_LINE = re.compile(r"checkpoint-(\d+) written in .*; resumed at step (\d+) .*, step (\d+) in")
PHASE_LINE = re.compile(
    r"^\s+generate (\d+\.\d+) s, score (\d+\.\d+) s, update (\d+\.\d+) s$", re.M
)
PEAK_LINE = re.compile(r"^\s+peak RSS in collect (\d+\.\d+) GiB, update (\d+\.\d+) GiB$", re.M)
ROLLOUT_LINE = re.compile(
    r"^(?P<model>\S+)\s+rollout 8 tokens: ordinary steps (?P<ordinary>\d+\.\d+) s, fixed steps "
    r"\(uncaptured\) (?P<fixed>\d+\.\d+) s .*trainer forward\| (?P<d_ordinary>\S+) / "
    r"(?P<d_fixed>\S+); rows decoded alike (?P<alike>\d+) of (?P<rows>\d+)$",
    re.M,
)
RATIO_LINE = re.compile(
    r"^(tiny|tiny-qwen2) (\S+): (grpokit / TRL|FSDP / unsharded) (.+?)\s+(\d+\.\d+)x", re.M
)
BUILT_LINE = re.compile(
    r"^built (?P<model>\S+) \((?P<type>\w+)\) in \d+ s: (?P<params>[\d,]+) parameters, "
    r"(?P<head>head tied to the embeddings|own head), float32; end tokens \[(?P<end>[\d, ]+)\] "
    r"suppressed$",
    re.M,
)
SETTINGS = ("lora-beta0.04", "full-beta0.04")
FSDP = "fsdp-beta0.04"
# What the smoke runs: both libraries on both models, and grpokit's FSDP on the Qwen2 one.
RUNS = {(m, s, lib) for m in ("tiny", "tiny-qwen2") for s in SETTINGS for lib in ("grpokit", "trl")}
RUNS.add(("tiny-qwen2", FSDP, "grpokit"))


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


def _import_gpu_check() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))
    return gpu_check


@pytest.mark.slow  # two tiny models, both libraries, FSDP: about 40 s; CI runs it (make test-slow)
def test_cpu_smoke_prints_both_libraries_and_a_resume() -> None:
    pytest.importorskip("trl")
    proc = _gpu_check("--cpu-smoke", "--threads", "1", timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "the packages the check imports are installed" in out

    # The Llama keeps its own head; the Qwen2 one is tied, as Qwen2.5 0.5B and 1.5B are, and its
    # end token's row (the embeddings') is the one zeroed.
    built = {m["model"]: m for m in BUILT_LINE.finditer(out)}
    assert set(built) == {"tiny", "tiny-qwen2"}, out
    assert (built["tiny"]["type"], built["tiny"]["head"]) == ("llama", "own head")
    assert (built["tiny-qwen2"]["type"], built["tiny-qwen2"]["head"]) == (
        "qwen2",
        "head tied to the embeddings",
    )
    # untied, the Llama holds its 49,152 x 64 embedding twice; the Qwen2 one its small one once
    assert int(built["tiny"]["params"].replace(",", "")) > 2 * 49152 * 64
    assert 0 < int(built["tiny-qwen2"]["params"].replace(",", "")) < 49152 * 64

    runs = {(m["model"], m["setting"], m["lib"]): m for m in RUN_LINE.finditer(out)}
    assert set(runs) == RUNS, out
    for m in runs.values():
        assert float(m["step"]) > 0 and int(m["tokens"]) > 0 and float(m["mem"]) > 0
        assert float(m["len"]) == 8.0  # end tokens suppressed: every completion runs to the end

    grpokit = sorted((m, s) for m, s, lib in RUNS if lib == "grpokit")
    resumes = [tuple(map(int, r)) for r in RESUME_LINE.findall(out)]
    assert resumes == [(2, 2, 3)] * len(grpokit)  # saved at 2, resumed at 2, went on to step 3
    # FSDP's run took the sharded path, in the process group of one the check makes
    assert out.count("sharded (FSDP2) over a process group of one") == 1
    assert "NOT sharded" not in out
    # grpokit's phases, from its step log: parts of the step, so they add up to at most its time
    phases = [tuple(map(float, p)) for p in PHASE_LINE.findall(out)]
    assert len(phases) == len(grpokit), out
    order = [(m["model"], m["setting"]) for m in RUN_LINE.finditer(out) if m["lib"] == "grpokit"]
    for (model, setting), parts in zip(order, phases, strict=True):
        assert all(t >= 0 for t in parts) and sum(parts) > 0
        assert sum(parts) <= float(runs[(model, setting, "grpokit")]["step"]) + 0.02  # rounded
    # the peak of each phase, each at most the run's peak, which one of them (or loading) sets
    peaks = [tuple(map(float, p)) for p in PEAK_LINE.findall(out)]
    assert len(peaks) == len(grpokit), out
    for (model, setting), parts in zip(order, peaks, strict=True):
        assert all(0 < m <= float(runs[(model, setting, "grpokit")]["mem"]) + 0.005 for m in parts)

    ratios = {
        (model, s, who, what): float(v)
        for model, s, who, what, v in RATIO_LINE.findall(
            out.split("\n== GPU check ratios")[-1].split("\n== ")[0]
        )
    }
    whats = ("seconds per step", "tokens per second", "peak RSS memory")
    expected = {
        (model, s, "grpokit / TRL", what)
        for model in ("tiny", "tiny-qwen2")
        for s in SETTINGS
        for what in whats
    }
    expected |= {("tiny-qwen2", FSDP, "FSDP / unsharded", what) for what in whats}
    assert set(ratios) == expected, out
    assert all(v > 0 for v in ratios.values())
    assert out.count("same tokens") == 5  # 4 grpokit / TRL pairs and FSDP / unsharded

    # the rollouts with ordinary and fixed-shape steps (uncaptured on the CPU): both as close to
    # the trainer's forward as float32 allows, the same greedy tokens in every row, per model
    rollouts = {r["model"]: r for r in ROLLOUT_LINE.finditer(out)}
    assert set(rollouts) == {"tiny", "tiny-qwen2"}, out
    for rollout in rollouts.values():
        assert float(rollout["ordinary"]) > 0 and float(rollout["fixed"]) > 0
        assert float(rollout["d_ordinary"]) < 1e-4 and float(rollout["d_fixed"]) < 1e-4
        assert rollout["alike"] == rollout["rows"] == "4"
    assert re.search(
        r"^time per shape, building included: tiny \d+\.\d min, tiny-qwen2 ", out, re.M
    )


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_end_tokens_suppressed_in_the_saved_head(tmp_path: Path, tied: bool) -> None:
    """Greedy decoding never ends a completion: the end token's row of the head (of the
    embeddings, where tied) is zero in the saved file, and so are the rows past the tokenizer
    (the untied case has 5, as the 7B shape's head has 128); every other row is as built."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.models.tiny import make_tiny_model_dir

    gpu_check = _import_gpu_check()
    tokenizer = gpu_check.smoke_tokenizer("qwen2", tmp_path)
    past = 0 if tied else 5
    config = {"tie_word_embeddings": tied}
    if past:
        config["vocab_size"] = len(AutoTokenizer.from_pretrained(tokenizer)) + past
    shape = gpu_check.Shape("qwen2", config)
    built = gpu_check.build_model("m", shape, tokenizer, tmp_path, "cpu", "float32")
    plain = make_tiny_model_dir(
        tmp_path / "plain", tokenizer_dir=tokenizer, model_type="qwen2", **config
    )

    name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    weights = load_file(str(built / "model.safetensors"))
    assert ("lm_head.weight" in weights) is not tied
    head, as_built = weights[name], load_file(str(plain / "model.safetensors"))[name]
    model = AutoModelForCausalLM.from_pretrained(built)
    end = model.generation_config.eos_token_id
    zeroed = [end, *range(head.shape[0] - past, head.shape[0])]
    kept = [i for i in range(head.shape[0]) if i not in zeroed]
    assert torch.count_nonzero(head[zeroed]) == 0
    assert torch.equal(head[kept], as_built[kept])
    assert gpu_check.saved_parameters(built) == model.num_parameters()

    ids = torch.randint(10, 200, (2, 12))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.all(logits[..., zeroed] == 0)
    assert not torch.isin(logits.argmax(-1), torch.tensor(zeroed)).any()


def test_shapes_are_the_released_models_and_the_default_run_fits_10_minutes() -> None:
    """The Qwen2 shapes hold as many parameters as the released models (the named models' counts;
    the 7B's as published), counted without building them; the default GPU run is estimated
    under 10 minutes, the 7B full fine-tuning left out."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpokit.hub.named import NAMED_MODELS

    gpu_check = _import_gpu_check()
    released = {
        "qwen2.5-0.5b": NAMED_MODELS["qwen2.5-coder-0.5b-instruct"].parameters,
        "qwen2.5-1.5b": NAMED_MODELS["qwen2.5-coder-1.5b-instruct"].parameters,
        "qwen2.5-7b": 7_615_616_512,
    }
    for name, count in released.items():
        config = gpu_check.SHAPES[name].config
        with torch.device("meta"):
            model = Qwen2ForCausalLM(Qwen2Config(**config))
        assert model.num_parameters() == count, name
        biases = config["num_hidden_layers"] * (
            config["hidden_size"]
            + 2
            * config["hidden_size"]
            // config["num_attention_heads"]
            * config["num_key_value_heads"]
        )
        assert gpu_check.parameter_count(config) + biases == count, name
    shapes = {m: gpu_check.SHAPES[m] for m in gpu_check.DEFAULT_MODELS}
    assert "full-beta0.04" not in shapes["qwen2.5-7b"].settings
    assert gpu_check.FSDP_SETTING in shapes["qwen2.5-0.5b"].settings
    minutes = sum(gpu_check.estimate_seconds(s, 4 * 8) for s in shapes.values()) / 60
    assert 8 < minutes < 10


def test_wheels_folder_holds_what_a_torch_machine_lacks() -> None:
    pytest.importorskip("trl")
    gpu_check = _import_gpu_check()

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
