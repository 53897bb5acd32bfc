"""grpokit against TRL's GRPOTrainer on one CUDA GPU, offline: seconds per step, completion tokens
per second and peak GPU memory, for LoRA and full fine-tuning in bfloat16, on random-weight models
of the shapes users train.

Run it through ``bench/gpu_check.sh``, which first installs what is missing from the wheels
carried in ``bench/wheels``. This script then

- builds random-weight models of real shapes (:data:`SHAPES`), initialised on the GPU in bfloat16,
  nothing downloaded. By default Qwen2.5's 0.5B, 1.5B and 7B (Qwen2's architecture: biased query,
  key and value projections, a 151,936-token vocabulary, 152,064 for the 7B, rope theta 1e6; the
  0.5B and 1.5B with their embeddings tied to the head, as released: 494,032,768, 1,543,714,304
  and 7,615,616,512 parameters) with the Qwen2.5-Coder tokenizer; ``--models smollm2-135m
  llama-1b`` builds the Llama shapes of the first GPU run (untied, as then) with SmolLM2's;
- zeroes the output-layer rows of the end-of-sequence tokens (:func:`suppress_end_tokens`), so
  that greedy decoding (top-k 1, on both sides) never ends a completion early: every completion
  is its shape's length on both sides, the same token work (the per-run lines print the mean
  length). Where the head is tied to the embeddings the rows zeroed are the embeddings' too;
- runs grpokit's GRPO (beta 0.04, dapo) in bfloat16 on CUDA, LoRA (r 16) and full fine-tuning:
  a warm-up step, the measured steps, then (on the 0.5B shape) a checkpoint, and a new trainer
  resumed from that checkpoint runs one more step;
- runs grpokit's FSDP2 code on the 0.5B shape (full fine-tuning; ``fsdp-beta0.04``) in one
  process that joins a process group of one: nothing is sharded away, but every parameter is a
  DTensor and the rollout, update, checkpoint and resume take the paths a multi-GPU run takes,
  here on a GPU with nccl (two processes cannot share one GPU);
- runs TRL's GRPOTrainer on the same settings (transformers generation, no vLLM), through
  bench/train_step.py's harness, which this script reuses for both libraries;
- prints per run the median seconds per step, completion tokens per second and peak GPU memory,
  then the ratios last. Each (library, model, setting) runs in its own process on the GPU, so its
  peak memory is its own;
- then, per model, times grpokit's rollout (greedy, every completion to the limit) with the
  static decoder's ordinary steps and with its steps replayed from a CUDA graph
  (``TorchEngine(cuda_graphs=True)``, grpokit.native.graphs), and checks both against the
  trainer's forward: how far each engine's log-probs are from it, and whether the two engines
  chose the same tokens (``--rollouts-only`` runs only this).

Sized to finish in under 10 minutes on an H100 or H200: the 0.5B shape runs 2 measured steps of
128 tokens, the 1.5B and 7B 1 step of 64 tokens without the checkpoint, and the 7B LoRA only
(full fine-tuning with AdamW in bfloat16 holds 71 GiB of weights, gradients, moments and the
beta 0.04 reference before any activation: about 90 GiB with them, more than an H100's 80 GB;
``--models qwen2.5-7b --settings full-beta0.04`` tries it on an H200). The script prints its
estimate per shape at the start (:func:`estimate_seconds`: 9.1 minutes in all, scaled from the
first H200 run of the Llama shapes) and the time each shape took at the end. It has not run on
a GPU yet with these shapes.

    bench/gpu_check.sh                      # on the GPU machine (estimated 9.1 minutes)
    bench/gpu_check.sh --cpu-smoke          # tiny models, float32 on CPU: the same code path
    bench/gpu_check.sh --fill-wheels        # with network: the wheels and tokenizers it needs

With ``--cpu-smoke`` the models are tiny (a Llama, and a Qwen2 with its head tied and a small
tokenizer of Qwen2's kind), each side runs in one process and measures nothing; it keeps the
script working where there is no GPU.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    REPO,
    _safetensors_header,
    emit_result,
    load_average,
    median,
    peak_gpu_mib,
    peak_rss_mib,
    peak_rss_since_reset_mib,
    print_ratios,
    reset_peak_rss_mib,
    run_child,
    suppress_end_tokens,
)
from train_step import (  # noqa: E402
    SETTINGS,
    grpokit_steps,
    grpokit_trainer,
    run_trl,
)

FSDP_SETTING = "fsdp-beta0.04"
"""full-beta0.04 with training.fsdp, in a process joined to a process group of one."""
ROLLOUT = "rollout"
"""The setting of an item that times the rollouts (:func:`graph_rollouts`)."""


@dataclass(frozen=True)
class Shape:
    """A model the check builds, and what the GPU run does with it unless told otherwise."""

    model_type: str
    """transformers' model_type (grpokit.models.tiny.MODEL_TYPES); it picks the tokenizer."""
    config: dict[str, Any]
    """Config fields over grpokit.models.tiny.TINY_CONFIG; no vocab_size: the tokenizer's."""
    settings: tuple[str, ...] = ("lora-beta0.04", "full-beta0.04")
    steps: int = 2
    """Measured steps, after one warm-up."""
    max_completion_length: int = 128
    checkpoint: bool = True
    """grpokit's runs write a checkpoint and a resumed trainer runs one more step."""


_QWEN2_5 = {
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,  # the converted 0.5B's 9.999999974752427e-07 is 1e-06 through float32
    "use_sliding_window": False,
}
"""What Qwen2.5's released configs share (Qwen2.5-Coder-0.5B-Instruct's converted config:
``grpokit models`` installs it; the 1.5B's and 7B's as published)."""

SHAPES: dict[str, Shape] = {
    "qwen2.5-0.5b": Shape(
        "qwen2",
        {
            **_QWEN2_5,
            "hidden_size": 896,
            "intermediate_size": 4864,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        },
        settings=("lora-beta0.04", "full-beta0.04", FSDP_SETTING),
    ),
    "qwen2.5-1.5b": Shape(
        "qwen2",
        {
            **_QWEN2_5,
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_hidden_layers": 28,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        },
        steps=1,
        max_completion_length=64,
        checkpoint=False,  # written and resumed, its full state would add about 45 s
    ),
    "qwen2.5-7b": Shape(
        "qwen2",
        {
            **_QWEN2_5,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "tie_word_embeddings": False,
        },
        settings=("lora-beta0.04",),
        steps=1,
        max_completion_length=64,
        checkpoint=False,
    ),
    # SmolLM2-135M's config, with an untied head as in the first GPU run: 163M parameters.
    "smollm2-135m": Shape(
        "llama",
        {
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "max_position_embeddings": 8192,
            "rope_theta": 100000.0,
            "tie_word_embeddings": False,
        },
    ),
    # Llama-3.2-1B's layers; with SmolLM2's 49k vocabulary and an untied head, 1.17B parameters.
    "llama-1b": Shape(
        "llama",
        {
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 8192,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
        },
    ),
}
DEFAULT_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b")
SMOKE_SHAPES: dict[str, Shape] = {
    "tiny": Shape("llama", {"tie_word_embeddings": False}, steps=1, max_completion_length=8),
    "tiny-qwen2": Shape(
        "qwen2",
        {"rope_theta": 1000000.0, "tie_word_embeddings": True},
        settings=("lora-beta0.04", "full-beta0.04", FSDP_SETTING),
        steps=1,
        max_completion_length=8,
    ),
}
"""--cpu-smoke's models: grpokit.models.tiny's default shape, 2 layers of width 64, as a Llama
with SmolLM2's tokenizer and as a Qwen2 (biases, head tied) with a small tokenizer of Qwen2's
kind; the Qwen2 one runs FSDP as the 0.5B shape does on the GPU."""
WHEELS = REPO / "bench" / "wheels"
TOKENIZER_DIRS = {"llama": "smollm2-tokenizer", "qwen2": "qwen2.5-tokenizer"}
"""Where --fill-wheels saves each family's tokenizer, inside the wheels folder."""
QWEN_TOKENIZER_MODEL = "qwen2.5-coder-0.5b-instruct"
"""The named model (grpokit.hub.named) whose tokenizer the Qwen2 shapes use."""

CHECK_PACKAGES = {
    "transformers",
    "peft",
    "accelerate",
    "pydantic",
    "pyyaml",
    "numpy",
    "math-verify",
    "trl",
}
"""The distributions grpokit's training path and TRL's GRPOTrainer import, torch aside (the
report's matplotlib, tensorboard, the judge's httpx, GGUF export are not needed here)."""

ASSUMED = ["torch", "transformers", "peft"]
"""What --fill-wheels assumes the GPU machine has (with their own dependencies): their wheels are
left out of the folder unless ``--assume-installed`` says otherwise."""

SKIP_WHEELS = {"torch", "triton"}
"""Never downloaded: the GPU machine brings its CUDA build of torch (several GB)."""


# ---- (a) requirements and the wheels folder ---------------------------------------------------


def _requirement(line: str) -> Any:
    """A parsed requirement; pip's vendored ``packaging`` where the package itself is missing."""
    try:
        from packaging.requirements import Requirement
    except ModuleNotFoundError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement(line)


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def requirements() -> list[str]:
    """What the check imports besides torch: :data:`CHECK_PACKAGES`, with the version ranges
    grpokit's pyproject.toml gives them (TRL's from the dev extra)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pip's vendored copy of the same parser
        from pip._vendor import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    return [r for r in declared if _canonical(_requirement(r).name) in CHECK_PACKAGES]


def missing_requirements() -> list[str]:
    """The requirements this Python lacks or has in a version outside the range."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for line in requirements():
        req = _requirement(line)
        try:
            have = version(req.name)
        except PackageNotFoundError:
            out.append(line)
            continue
        if not req.specifier.contains(have, prereleases=True):
            out.append(line)
    return out


def installed_closure(
    names: list[str], python_version: str, skip: set[str] = SKIP_WHEELS, depth: int = 99
) -> dict[str, str | None]:
    """Distributions ``names`` need, to ``depth`` levels of requirements, as installed here (name
    -> version; None for one the target Python needs that this one does not have), not looking
    into ``skip``."""
    from importlib.metadata import PackageNotFoundError, distribution

    env = {"python_version": python_version, "python_full_version": f"{python_version}.0"}
    found: dict[str, str | None] = {}
    todo: list[tuple[str, frozenset[str], int]] = [(n, frozenset(), 0) for n in names]
    expanded: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras, level = todo.pop(0)  # breadth first: the shallowest path sets the level
        key = _canonical(name)
        if key in skip or (key, extras) in expanded:
            continue
        expanded.add((key, extras))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            found.setdefault(key, None)
            continue
        found[key] = dist.version
        if level == depth:
            continue
        for line in dist.requires or []:
            req = _requirement(line)
            wanted = req.marker is None or any(
                req.marker.evaluate({**env, "extra": e}) for e in {"", *extras}
            )
            if wanted:
                todo.append((req.name, frozenset(req.extras), level + 1))
    return found


def wheels_needed(assumed: list[str], python_version: str) -> dict[str, str | None]:
    """What the wheels folder holds: the check's packages that ``assumed`` and torch do not
    require directly, their direct requirements, and whatever else they need that ``assumed``
    does not bring; never ``assumed`` themselves nor torch. (pydantic, for one, comes with
    transformers 5 here, through typer, but not with transformers 4.)"""
    names = [_requirement(r).name for r in requirements()]
    skip = {_canonical(n) for n in assumed} | SKIP_WHEELS
    brought = installed_closure([*assumed, "torch"], python_version, skip=set())
    direct = installed_closure([*assumed, "torch"], python_version, skip=set(), depth=1)
    own = [n for n in names if _canonical(n) not in skip | set(direct)]
    near = installed_closure(own, python_version, skip=skip, depth=1)
    return {
        n: v
        for n, v in installed_closure(own, python_version, skip=skip).items()
        if n not in brought or (n in near and n not in direct)
    }


def _pip(*args: str) -> bool:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if proc.returncode:
        print(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "pip failed")
    return proc.returncode == 0


def fill_wheels(dest: Path, python_versions: list[str], assumed: list[str]) -> None:
    """Download, for Linux x86-64 and each CPython version, the wheels of what the check needs
    (the versions installed here) but what ``assumed`` brings, and save the tokenizers the
    shapes use (:data:`TOKENIZER_DIRS`)."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    for pv in python_versions:
        need = wheels_needed(assumed, pv)
        pins = [f"{n}=={v}" if v else n for n, v in sorted(need.items())]
        target = ["--python-version", pv, "--implementation", "cp", "--only-binary=:all:"]
        target += [x for p in platforms for x in ("--platform", p)]
        print(f"Python {pv}: {', '.join(pins)} -> {dest}", flush=True)
        if _pip("download", "--quiet", "--no-deps", "-d", str(dest), *target, *pins):
            continue
        for pin in pins:  # one by one, to name the ones without a wheel for this Python
            if not _pip("download", "--quiet", "--no-deps", "-d", str(dest), *target, pin):
                print(f"  no wheel of {pin} for Python {pv}: add one to {dest} by hand")
    from transformers import AutoTokenizer

    for model_type, folder in TOKENIZER_DIRS.items():
        AutoTokenizer.from_pretrained(tokenizer_source(model_type)).save_pretrained(dest / folder)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(
        f"{dest}: {len(list(dest.glob('*.whl')))} wheels and the tokenizers "
        f"({', '.join(TOKENIZER_DIRS.values())}), {size / 2**20:.0f} MiB"
    )


# ---- (b) the models -----------------------------------------------------------------------------


def tokenizer_source(model_type: str) -> Path:
    """This machine's tokenizer of a family: the embedded SmolLM2 model's for llama, the installed
    Qwen2.5-Coder model's for qwen2 (converted on first use; not installed: a UserError that says
    how to install it)."""
    if model_type == "llama":
        from grpokit.hub.embedded import embedded_model_dir

        return embedded_model_dir()
    from grpokit.hub.named import NAMED_MODELS, named_model_dir

    return named_model_dir(NAMED_MODELS[QWEN_TOKENIZER_MODEL])


def default_tokenizer(model_type: str) -> Path:
    """The family's tokenizer carried in the wheels folder (the GPU machine has no other), else
    this machine's."""
    carried = WHEELS / TOKENIZER_DIRS[model_type]
    if (carried / "tokenizer_config.json").is_file():
        return carried
    return tokenizer_source(model_type)


def smoke_tokenizer(model_type: str, work: Path) -> Path:
    """--cpu-smoke's tokenizer: SmolLM2's as on the GPU for llama; for qwen2 a small one of Qwen2's
    kind built here, so that the smoke needs no installed Qwen model and its tiny model no
    151,936-row embedding."""
    if model_type == "llama":
        return default_tokenizer(model_type)
    from grpokit.models.tiny import make_tiny_tokenizer_dir

    return make_tiny_tokenizer_dir(work / f"{model_type}-tokenizer", model_type)


def saved_parameters(model_dir: Path) -> int:
    """The parameters a saved model holds (a tied head once), read from the files' headers."""
    count = 0
    for path in model_dir.glob("*.safetensors"):
        for entry in _safetensors_header(path)[1].values():
            elements = 1
            for n in entry["shape"]:
                elements *= n
            count += elements
    return count


def build_model(
    name: str, shape: Shape, tokenizer: Path, root: Path, device: str, dtype: str
) -> Path:
    """A random-weight model of ``shape`` with ``tokenizer``, initialised on ``device`` in
    ``dtype`` (a torch dtype's name), its end tokens suppressed; built once into ``root/name`` (a
    rerun with the same recipe reuses it)."""
    import torch

    from grpokit.models.tiny import make_tiny_model_dir

    out = root / name
    recipe = {
        "model_type": shape.model_type,
        "shape": shape.config,
        "tokenizer": str(tokenizer.resolve()),
        "dtype": dtype,
    }
    marker = out / "gpu_check.json"
    if marker.is_file() and json.loads(marker.read_text()) == recipe:
        return out
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    make_tiny_model_dir(
        tmp,
        seed=0,
        tokenizer_dir=tokenizer,
        model_type=shape.model_type,
        dtype=getattr(torch, dtype),
        device=device,
        **shape.config,
    )
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the runs, in their own processes, need the GPU's memory
    end, past = suppress_end_tokens(tmp)
    (tmp / "gpu_check.json").write_text(json.dumps(recipe))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    head = "head tied to the embeddings" if shape.config.get("tie_word_embeddings") else "own head"
    also = f" and the {past} ids past the tokenizer" if past else ""
    print(
        f"built {name} ({shape.model_type}) in {time.perf_counter() - t0:.0f} s: "
        f"{saved_parameters(out):,} parameters, {head}, {dtype}; end tokens {end}{also} "
        "suppressed",
        flush=True,
    )
    return out


# ---- the estimate -------------------------------------------------------------------------------
# Scaled from the first run on an H200 (bench/RESULTS.md): the Llama shapes' 8 runs took 7 min 16 s
# with the install and their builds (float32, on the CPU then). For those runs (no rollouts then)
# and this check's builds estimate_seconds gives 6.4 minutes; the rest, about 50 s, is that slower
# build and the install. A step there was bound by the host launching kernels, not by the GPU: its
# time follows the layer count more than the size.

RUN_START_S = 23.0
"""A run's process besides its steps and checkpoint: imports, CUDA, loading, set-up: the first
run's 436 s less its steps and checkpoints (183 s), its builds and install (about 60 s,
estimated), over its 8 runs."""
TOKEN_LAYER_S = 0.75e-3
"""One decoding step of one layer: grpokit generated 128 tokens in 2.89 s with 30 layers and in
1.54 s with 16 (32 rows)."""
UPDATE_LAYER_S = 0.07
"""grpokit's update, per layer: 2.10 s with 30 layers (0.64 s with 16: an over-estimate there)."""
TRL_STEP = {"lora": 2.3, "full": 1.25}
"""TRL's step against grpokit's: 2.26x and 2.35x with LoRA, 1.28x and 1.18x full."""
FULL_CHECKPOINT_S = 30e-9
"""Writing full fine-tuning's state and resuming from it, per parameter: 21.5 + 13.5 s for the
1.17B Llama shape."""
FSDP_STEP = 1.2
"""FSDP's step against the unsharded one: a guess (gathering every unit, one rank)."""
GPU_FLOPS = 4e14
"""bfloat16, achieved; only the 7B's update computes long enough for it to count."""
BYTES_PER_S = 1e9
"""Writing a built model, reading one to load it (bfloat16, 2 bytes a parameter)."""
PROMPT_TOKENS = 40
"""A prompt's tokens, chat template included."""
GRAPHED_DECODING = 1 / 7
"""CUDA-graph decoding steps against ordinary ones: 6.8-9.0x faster in the probe."""


def parameter_count(config: dict[str, Any], vocab_size: int = 49152) -> int:
    """A Llama's or Qwen2's parameters for ``config`` (Qwen2's biases, a rounding error, left
    out); ``vocab_size`` where the config leaves it to the tokenizer (SmolLM2's)."""
    from grpokit.models.tiny import TINY_CONFIG

    c = {**TINY_CONFIG, **config}
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    layer = 2 * h * h + 2 * h * kv + 3 * h * c["intermediate_size"] + 2 * h
    embeddings = (1 if c["tie_word_embeddings"] else 2) * c.get("vocab_size", vocab_size) * h
    return int(layers * layer + embeddings + h)


def estimate_seconds(shape: Shape, rows: int) -> float:
    """The GPU machine's seconds for ``shape`` as planned (its settings, steps, length and
    checkpoint; ``rows`` completions a step): building it, its runs, its rollouts (in its first
    grpokit run's process; the caller adds a process start where they run alone). The constants
    above say what each rests on."""
    params = parameter_count(shape.config)
    layers: int = shape.config.get("num_hidden_layers", 2)
    load = 2 * params / BYTES_PER_S
    decoding = shape.max_completion_length * layers * TOKEN_LAYER_S
    tokens = rows * (shape.max_completion_length + PROMPT_TOKENS)
    step = decoding + layers * UPDATE_LAYER_S + 8 * params * tokens / GPU_FLOPS
    seconds = 2 * load + (shape.steps + 2) * decoding * (1 + GRAPHED_DECODING)  # build, rollouts
    for setting in shape.settings:
        kind = "lora" if run_setting(setting)[0]["lora"] else "full"
        grpokit_steps = 1 + shape.steps + shape.checkpoint  # warm-up, measured, after resuming
        # A LoRA checkpoint is small, but resuming from it loads the model again.
        checkpoint = (load if kind == "lora" else FULL_CHECKPOINT_S * params) * shape.checkpoint
        factor = FSDP_STEP if setting == FSDP_SETTING else 1.0
        seconds += RUN_START_S + load + grpokit_steps * step * factor + checkpoint
        if "trl" in peers(setting):
            seconds += RUN_START_S + load + (1 + shape.steps) * step * TRL_STEP[kind]
    return seconds


# ---- (c) the runs, in child processes -----------------------------------------------------------


def run_setting(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """train_step's setting of ``name`` and the training fields it adds to grpokit's config."""
    if name == FSDP_SETTING:
        return SETTINGS["full-beta0.04"], {"fsdp": True}
    return SETTINGS[name], {}


def peers(setting: str) -> tuple[str, ...]:
    """The libraries a setting runs in: FSDP is grpokit's alone, compared with grpokit unsharded."""
    return ("grpokit",) if setting == FSDP_SETTING else ("grpokit", "trl")


@contextmanager
def process_group_of_one(device: str) -> Iterator[None]:
    """This process alone as a process group (nccl on CUDA, gloo on the CPU): a grpokit trainer
    built inside shards with training.fsdp, as its ranks do in a multi-GPU run."""
    import torch.distributed as dist

    backend = "nccl" if device.startswith("cuda") else "gloo"
    store = dist.HashStore()  # type: ignore[attr-defined]  # exported, not declared so
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _reset_gpu_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


class PhasePeaks:
    """The peak memory of each phase of a grpokit trainer's steps: its ``collect`` (the rollout
    and its scoring) and its ``update`` (the optimizer steps), wrapped so that the peak is reset
    before each call and read after it: GPU memory allocated on CUDA, resident memory elsewhere.
    Which phase sets a run's peak tells where to look when it is above the peer's. The resets
    would hide the run's peak from a later read, so :meth:`overall` keeps it."""

    PHASES = ("collect", "update")

    def __init__(self, trainer: Any, device: str) -> None:
        import torch

        def read_gpu() -> float:
            return peak_gpu_mib() or 0.0

        self.cuda = device.startswith("cuda")
        self._reset, self._read = (
            (torch.cuda.reset_peak_memory_stats, read_gpu)
            if self.cuda
            else (reset_peak_rss_mib, peak_rss_since_reset_mib)
        )
        self.peaks: dict[str, list[float]] = {p: [] for p in self.PHASES}
        self._before = self._read()  # loading the models, before the first reset
        for name in self.PHASES:
            setattr(trainer, name, self._wrapped(name, getattr(trainer, name)))

    def _wrapped(self, name: str, method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._reset()
            try:
                return method(*args, **kwargs)
            finally:
                self.peaks[name].append(self._read())

        return call

    def overall(self) -> float:
        """The run's peak so far (MiB): the largest of the phases', of what came before them and
        of what came after the last."""
        return max([self._before, self._read(), *(m for p in self.peaks.values() for m in p)])


def grpokit_run(
    args: argparse.Namespace, setting: dict[str, Any], training: dict[str, Any]
) -> dict[str, Any]:
    """Warm-up and measured steps, then (``args.checkpoint``) a checkpoint and a resumed trainer's
    next step; ``training``: more fields of grpokit's training config."""
    import gc

    from grpokit.train.trainer import GRPOTrainer

    warmup = 1
    trainer = grpokit_trainer(args, setting, max_steps=warmup + args.steps + 1, training=training)
    peaks = PhasePeaks(trainer, args.device)
    times, lengths, phases = grpokit_steps(trainer, warmup + args.steps)
    overall = peaks.overall()
    out: dict[str, Any] = {
        "step_times": times[warmup:],
        "phases": {p: median(t[warmup:]) for p, t in phases.items()},
        "phase_peaks_mib": {p: max(m) for p, m in peaks.peaks.items()},
        "mean_length": median(lengths[warmup:]),
        "rss_mib": max(peak_rss_mib(), overall) if not peaks.cuda else peak_rss_mib(),
        "gpu_peak_mib": overall if peaks.cuda else peak_gpu_mib(),
        "sharded": trainer.sharded,
    }
    if not args.checkpoint:
        trainer.close()
        shutil.rmtree(trainer.run_dir.parent, ignore_errors=True)
        return out
    t0 = time.perf_counter()
    checkpoint = trainer.save()
    out["save_s"] = time.perf_counter() - t0
    out["checkpoint"] = checkpoint.name
    cfg, run_dir = trainer.cfg, trainer.run_dir
    trainer.close()
    del trainer
    gc.collect()
    t0 = time.perf_counter()
    resumed = GRPOTrainer(cfg, run_dir=run_dir, resume=True, progress=False, log=lambda m: None)
    out["resumed_at"] = resumed.state.global_step
    out["load_s"] = time.perf_counter() - t0
    out["resumed_step_times"], _, _ = grpokit_steps(resumed, 1)
    out["after_resume"] = resumed.state.global_step
    resumed.close()
    shutil.rmtree(run_dir.parent, ignore_errors=True)  # the run's temporary directory
    return out


def graph_rollouts(args: argparse.Namespace) -> dict[str, Any]:
    """One model's rollout with ordinary and with CUDA-graph steps: seconds (a warm-up, then
    the median of ``args.steps + 1`` rollouts), each engine's largest log-prob difference to the
    trainer's forward on its own tokens, and how many rows the two decoded alike."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.torch_engine import TorchEngine
    from grpokit.train.forward import completion_logprobs, pack

    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype).to(device).eval()
    eos = int(model.config.eos_token_id)
    gen = torch.Generator().manual_seed(0)
    top = min(1000, model.config.vocab_size)  # the smoke's Qwen2 tokenizer has fewer tokens
    prompts = [torch.randint(10, top, (20,), generator=gen).tolist() for _ in range(args.prompts)]
    params = SamplingParams(
        max_completion_length=args.max_completion_length, temperature=0, ignore_eos=True
    )

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    out: dict[str, Any] = {}
    batches = {}
    for name, graphs in (("ordinary", False), ("graphed", True)):
        engine = TorchEngine(
            model,
            eos_token_ids=[eos],
            pad_token_id=eos,
            decoder="static",
            compute_dtype=dtype,
            cuda_graphs=graphs,
        )
        times = []
        for _ in range(args.steps + 2):
            sync()
            t0 = time.perf_counter()
            batch = engine.generate(prompts, args.num_generations, params)
            sync()
            times.append(time.perf_counter() - t0)
        batches[name] = batch
        rows = [batch.prompt_ids[batch.prompt_index(r)] for r in range(len(batch))]
        with torch.no_grad():
            want, _ = completion_logprobs(model, pack(rows, batch.completion_ids, eos))
        got = torch.nn.utils.rnn.pad_sequence(list(batch.logprobs), batch_first=True)
        out[name] = {
            "seconds": median(times[1:]),
            "vs_forward": float((got.to(device) - want.float()).abs().max()),
        }
    same = [
        a == b
        for a, b in zip(
            batches["ordinary"].completion_ids, batches["graphed"].completion_ids, strict=True
        )
    ]
    out["same_rows"], out["rows"] = sum(same), len(same)
    return out


def report_graphs(model: str, r: dict[str, Any], tokens: int, device: str) -> None:
    ordinary, graphed = r["ordinary"], r["graphed"]
    # On the CPU the fixed-shape steps run uncaptured: the same code path, nothing to time.
    label = "CUDA graph" if device == "cuda" else "fixed steps (uncaptured)"
    print(
        f"{model:<13} rollout {tokens} tokens: ordinary steps {ordinary['seconds']:.2f} s, "
        f"{label} {graphed['seconds']:.2f} s ({ordinary['seconds'] / graphed['seconds']:.2f}x"
        f" faster); largest |log-prob - trainer forward| {ordinary['vs_forward']:.3g} / "
        f"{graphed['vs_forward']:.3g}; rows decoded alike {r['same_rows']} of {r['rows']}",
        flush=True,
    )


def run_item(args: argparse.Namespace, setting: str) -> dict[str, Any]:
    """One run of ``args.model_path``: ``setting`` (``rollout``: :func:`graph_rollouts`) in
    ``args.child``'s library."""
    if setting == ROLLOUT:
        return graph_rollouts(args)
    if args.child == "trl":
        return run_trl(args, SETTINGS[setting])
    if setting == FSDP_SETTING:
        with process_group_of_one(args.device):
            return grpokit_run(args, *run_setting(setting))
    return grpokit_run(args, *run_setting(setting))


def child(args: argparse.Namespace) -> None:
    """Run ``--run MODEL_DIR=SETTING`` items for one library; print their results."""
    import gc

    results = []
    for item in args.run:
        path, setting = item.rsplit("=", 1)
        run_args = copy.copy(args)
        run_args.model_path = path
        _reset_gpu_peak(args.device)
        # An item that fails is reported and the next goes on (the rollouts that follow a run
        # must not take its figures with them).
        t0 = time.perf_counter()
        try:
            result = run_item(run_args, setting)
        except Exception as err:  # noqa: BLE001
            result = {"error": f"{type(err).__name__}: {err}"}
        results.append({**result, "seconds": time.perf_counter() - t0})
        gc.collect()
    emit_result({"runs": results})


# ---- (d) the report -----------------------------------------------------------------------------


def _memory(r: dict[str, Any]) -> tuple[float, str]:
    if r.get("gpu_peak_mib") is not None:
        return r["gpu_peak_mib"], "GPU"
    return r["rss_mib"], "RSS"


def report_run(
    model: str, setting: str, peer: str, r: dict[str, Any], per_step: int, seconds: float
) -> None:
    """One run's lines: its steps, then grpokit's phases, peaks, sharding and checkpoint."""
    step = median(r["step_times"])
    tokens = per_step * r["mean_length"] / step
    memory, kind = _memory(r)
    print(
        f"{model:<13} {setting:<14} {peer:<8} {step:8.2f} s/step {tokens:10.0f} tokens/s "
        f"peak {kind} {memory / 1024:6.2f} GiB  completion {r['mean_length']:.1f} tokens "
        f"(steps {', '.join(f'{t:.2f}' for t in r['step_times'])}; run {seconds:.0f} s)",
        flush=True,
    )
    indent = f"{'':<13} {'':<14} {'':<8}"
    if "phases" in r:  # where a grpokit step spends its time (medians of the measured steps)
        spent = ", ".join(f"{p} {t:.2f} s" for p, t in r["phases"].items())
        print(f"{indent} {spent}", flush=True)
    if "phase_peaks_mib" in r:  # which phase sets the peak
        peaks = ", ".join(f"{p} {m / 1024:.2f} GiB" for p, m in r["phase_peaks_mib"].items())
        print(f"{indent} peak {kind} in {peaks}", flush=True)
    if setting == FSDP_SETTING:
        how = "sharded (FSDP2)" if r["sharded"] else "NOT sharded: ran without FSDP"
        print(f"{indent} {how} over a process group of one", flush=True)
    if "checkpoint" in r:
        print(
            f"{indent} {r['checkpoint']} written in {r['save_s']:.1f} s; "
            f"resumed at step {r['resumed_at']} (loaded in {r['load_s']:.1f} s), step "
            f"{r['after_resume']} in {r['resumed_step_times'][0]:.2f} s",
            flush=True,
        )


def ratios_of(
    model: str, shape: Shape, results: dict[tuple[str, str, str], dict[str, Any]]
) -> list[tuple[str, float, str]]:
    """grpokit against TRL per setting, and FSDP against grpokit unsharded, of one model."""
    out: list[tuple[str, float, str]] = []
    for setting in shape.settings:
        if setting == FSDP_SETTING:
            other, name = (model, "full-beta0.04", "grpokit"), "FSDP / unsharded"
        else:
            other, name = (model, setting, "trl"), "grpokit / TRL"
        ours, theirs = results.get((model, setting, "grpokit")), results.get(other)
        if ours is None or theirs is None:
            continue
        same = ours["mean_length"] == theirs["mean_length"] == shape.max_completion_length
        t = median(ours["step_times"]) / median(theirs["step_times"])
        label = f"{model} {setting}: {name}"
        out.append(
            (
                f"{label} seconds per step",
                t,
                "same tokens" if same else "DIFFERENT completion lengths",
            )
        )
        rate = ours["mean_length"] / theirs["mean_length"] / t
        out.append((f"{label} tokens per second", rate, "higher is faster"))
        mine, kind = _memory(ours)
        out.append((f"{label} peak {kind} memory", mine / _memory(theirs)[0], ""))
    return out


def describe(name: str, shape: Shape, estimate: float | None) -> str:
    """One line of the plan: what a shape runs, and the estimate."""
    steps = f"{shape.steps} measured step{'s' if shape.steps > 1 else ''}"
    resume = "; checkpoint and resume" if shape.checkpoint and shape.settings else ""
    line = (
        f"{name:<13} {shape.model_type}: {', '.join(shape.settings) or 'rollouts only'}; "
        f"1 warm-up + {steps} of {shape.max_completion_length} tokens{resume}"
    )
    return line + (f"; estimated {estimate / 60:.1f} min" if estimate is not None else "")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny models, float32 on CPU")
    ap.add_argument(
        "--models",
        nargs="+",
        help=f"shapes to run (default {', '.join(DEFAULT_MODELS)}; of {', '.join(SHAPES)})",
    )
    ap.add_argument(
        "--settings",
        nargs="+",
        choices=[*SETTINGS, FSDP_SETTING],
        help="settings for every shape (default: each shape's own)",
    )
    ap.add_argument("--steps", type=int, help="measured steps, after 1 warm-up (default: shape's)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, help="default: each shape's own")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer dir (default: carried or installed)")
    ap.add_argument(
        "--work", type=Path, help="where the models are built (default bench/.gpu-check)"
    )
    ap.add_argument("--missing", action="store_true", help="print the missing requirements")
    ap.add_argument("--fill-wheels", type=Path, metavar="DIR", help="download the wheels into DIR")
    ap.add_argument("--python-version", nargs="+", help="CPython versions for --fill-wheels")
    ap.add_argument(
        "--assume-installed",
        nargs="*",
        default=ASSUMED,
        help="--fill-wheels leaves these and their dependencies out (none: leave out only torch)",
    )
    ap.add_argument(
        "--rollouts-only",
        action="store_true",
        help="only the rollouts with ordinary and CUDA-graph steps (no training runs)",
    )
    ap.add_argument("--child", choices=["grpokit", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--run", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--no-checkpoint", dest="checkpoint", action="store_false", help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    # train_step's harness reads these too.
    args.gradient_checkpointing, args.top_k = False, 1
    return args


def planned(
    args: argparse.Namespace, names: Sequence[str], shapes: dict[str, Shape]
) -> dict[str, Shape]:
    """The shapes to run, with what the command line sets over their own settings."""
    unknown = [n for n in names if n not in shapes]
    if unknown:
        sys.exit(f"unknown model(s) {', '.join(unknown)}; one of {', '.join(shapes)}")
    return {
        n: replace(
            shapes[n],
            settings=() if args.rollouts_only else tuple(args.settings or shapes[n].settings),
            steps=args.steps or shapes[n].steps,
            max_completion_length=args.max_completion_length or shapes[n].max_completion_length,
        )
        for n in names
    }


def child_args(args: argparse.Namespace, shape: Shape) -> list[str]:
    """What a child process runs a shape's items with."""
    return [
        f"--steps={shape.steps}",
        f"--prompts={args.prompts}",
        f"--num-generations={args.num_generations}",
        f"--max-completion-length={shape.max_completion_length}",
        f"--threads={args.threads}",
        f"--device={args.device}",
        *(["--bf16"] if args.bf16 else []),
        *([] if shape.checkpoint else ["--no-checkpoint"]),
    ]


Item = tuple[str, str]
"""(model, setting) of one run; setting :data:`ROLLOUT` for the rollouts."""


def process_groups(
    args: argparse.Namespace, shapes: dict[str, Shape]
) -> list[tuple[str, list[str], list[Item]]]:
    """The child processes to start, in order: (library, arguments, items). On the GPU each
    training run has its own, so that its peak memory is its own; a shape's rollouts follow in
    its first grpokit run's process, after that run's figures are taken (a process start is
    about 20 s). The smoke test runs each library's items in one process, to stay short."""
    groups: list[tuple[str, list[str], list[Item]]] = []
    for m, shape in shapes.items():
        cargs = child_args(args, shape)
        runs = [(peer, cargs, [(m, s)]) for s in shape.settings for peer in peers(s)]
        if runs and runs[0][0] == "grpokit":
            runs[0][2].append((m, ROLLOUT))
        else:
            runs.insert(0, ("grpokit", cargs, [(m, ROLLOUT)]))
        groups += runs
    if not args.cpu_smoke:
        return groups
    merged: list[tuple[str, list[str], list[Item]]] = []
    for peer, cargs, items in groups:
        same = [g for g in merged if g[0] == peer and g[1] == cargs]
        if same:
            same[0][2].extend(items)
        else:
            merged.append((peer, cargs, list(items)))
    return merged


def build_models(
    args: argparse.Namespace, shapes: dict[str, Shape], work: Path, spent: dict[str, float]
) -> dict[str, Path]:
    """Each shape's model directory, built where missing (seconds added to ``spent``)."""
    from grpokit.errors import UserError

    (work / "models").mkdir(parents=True, exist_ok=True)
    models = {}
    for m, shape in shapes.items():
        t0 = time.perf_counter()
        try:
            tokenizer = args.tokenizer or (
                smoke_tokenizer(shape.model_type, work)
                if args.cpu_smoke
                else default_tokenizer(shape.model_type)
            )
        except UserError as err:
            sys.exit(
                f"{err}\nOr carry its tokenizer: bench/gpu_check.sh --fill-wheels where it is "
                f"installed saves it into {WHEELS / TOKENIZER_DIRS[shape.model_type]}"
            )
        dtype = "bfloat16" if args.bf16 else "float32"
        models[m] = build_model(m, shape, tokenizer, work / "models", args.device, dtype)
        spent[m] += time.perf_counter() - t0
    return models


def run_groups(
    groups: list[tuple[str, list[str], list[Item]]],
    models: dict[str, Path],
    per_step: int,
    spent: dict[str, float],
) -> tuple[dict[tuple[str, str, str], dict[str, Any]], list[str]]:
    """Start the child processes, print each training run as it comes back; the results by
    (model, setting, library) and what failed. A run that fails is reported and the others go
    on: the first run on a new machine should bring back every figure it can."""
    results: dict[tuple[str, str, str], dict[str, Any]] = {}
    failed: list[str] = []
    script = Path(__file__).resolve()
    for peer, cargs, items in groups:
        t0 = time.perf_counter()
        try:
            run = ["--run", *(f"{models[m]}={s}" for m, s in items)]
            out = run_child(script, [*cargs, f"--child={peer}", *run])["runs"]
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            names = ", ".join(f"{m} {s}" for m, s in items)
            print(f"FAILED {peer} on {names}: {err}", flush=True)
            failed.append(f"{peer} on {names}")
            out = None
        took = time.perf_counter() - t0
        # Each item's own seconds, and an even share of the process's start and end.
        own = [r["seconds"] for r in out] if out else [0.0] * len(items)
        for i, (m, s) in enumerate(items):
            seconds = own[i] + (took - sum(own)) / len(items)
            spent[m] += seconds
            if out is None:
                continue
            if "error" in out[i]:
                print(f"FAILED {peer} on {m} {s}: {out[i]['error']}", flush=True)
                failed.append(f"{peer} on {m} {s}")
            else:
                results[(m, s, peer)] = out[i]
                if s != ROLLOUT:
                    report_run(m, s, peer, out[i], per_step, seconds)
    return results, failed


def main() -> None:
    args = parse_args()
    if args.missing:
        for line in missing_requirements():
            print(line)
        return
    if args.fill_wheels:
        versions = args.python_version or [f"{sys.version_info.major}.{sys.version_info.minor}"]
        fill_wheels(args.fill_wheels, versions, [n for n in args.assume_installed if n != "none"])
        return
    if args.child:
        child(args)
        return

    started = time.perf_counter()
    import torch

    if args.cpu_smoke:
        shapes = planned(args, args.models or list(SMOKE_SHAPES), SMOKE_SHAPES)
        args.device, args.bf16 = "cpu", False
        args.prompts, args.num_generations = 1, 4
        work = args.work or Path(tempfile.mkdtemp(prefix="grpokit-gpu-check-"))
        if args.work is None:
            atexit.register(shutil.rmtree, work, ignore_errors=True)
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device here; bench/gpu_check.sh --cpu-smoke runs the same on CPU")
        shapes = planned(args, args.models or list(DEFAULT_MODELS), SHAPES)
        args.device, args.bf16 = "cuda", True
        work = args.work or REPO / "bench" / ".gpu-check"
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    per_step = args.prompts * args.num_generations
    print(
        f"torch {torch.__version__} on {device}; {'bfloat16' if args.bf16 else 'float32'}; "
        f"{args.prompts} prompt(s) x {args.num_generations} completions a step, each of its "
        f"shape's length (greedy, end tokens suppressed); {load_average()}",
        flush=True,
    )
    estimates = {m: estimate_seconds(s, per_step) for m, s in shapes.items()}
    for m, shape in shapes.items():
        print(describe(m, shape, None if args.cpu_smoke else estimates[m]), flush=True)
    groups = process_groups(args, shapes)
    if not args.cpu_smoke:
        # Rollouts in a process of their own (no grpokit run before them) pay its start.
        alone = [i for _, _, i in groups if all(s == ROLLOUT for _, s in i)]
        starts = len(alone) * RUN_START_S
        print(
            f"estimated in all: {(sum(estimates.values()) + starts) / 60:.1f} min on an H100 "
            "or H200 (scaled from the first H200 run of the Llama shapes; not yet run on a GPU)",
            flush=True,
        )

    spent = dict.fromkeys(shapes, 0.0)
    models = build_models(args, shapes, work, spent)
    print(f"\n{'model':<13} {'setting':<14} {'library':<8}", flush=True)
    results, failed = run_groups(groups, models, per_step, spent)

    ratios = [r for m, shape in shapes.items() for r in ratios_of(m, shape, results)]
    if ratios:
        print_ratios("GPU check ratios", ratios)

    print(f"\n== rollouts: ordinary steps against CUDA-graph steps ({load_average()})")
    for m, shape in shapes.items():
        if (m, ROLLOUT, "grpokit") in results:
            report_graphs(
                m, results[(m, ROLLOUT, "grpokit")], shape.max_completion_length, args.device
            )
    per_shape = ", ".join(
        f"{m} {spent[m] / 60:.1f} min"
        + ("" if args.cpu_smoke else f" (estimated {estimates[m] / 60:.1f})")
        for m in shapes
    )
    print(f"\ntime per shape, building included: {per_shape}")
    print(f"total {time.perf_counter() - started:.0f} s")
    if failed:
        sys.exit(f"{len(failed)} run(s) failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
