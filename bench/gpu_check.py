"""grpokit against TRL's GRPOTrainer on one CUDA GPU, offline: seconds per step, completion tokens
per second and peak GPU memory, for LoRA and full fine-tuning in bfloat16.

Run it through ``bench/gpu_check.sh``, which first installs what is missing from the wheels
carried in ``bench/wheels``. This script then

- builds two random-weight Llama models with the embedded SmolLM2 tokenizer, nothing downloaded:
  SmolLM2-135M's shape, and a ~1B shape (Llama-3.2-1B's layers with SmolLM2's vocabulary);
- zeroes the output-layer rows of the end-of-sequence tokens, so that greedy decoding (top-k 1,
  on both sides) never ends a completion early: every completion is max_completion_length
  tokens on both sides, the same token work (the per-run lines print the mean length);
- runs grpokit's GRPO (beta 0.04, dapo) in bfloat16 on CUDA, LoRA (r 16) and full fine-tuning:
  a warm-up step, the measured steps, a checkpoint, then a new trainer resumed from that
  checkpoint runs one more step;
- runs TRL's GRPOTrainer on the same settings (transformers generation, no vLLM), through
  bench/train_step.py's harness, which this script reuses for both libraries;
- prints per run the median seconds per step, completion tokens per second and peak GPU memory,
  then the ratios last. Each (library, model, setting) runs in its own process on the GPU, so its
  peak memory is its own;
- then, per model, times grpokit's rollout (greedy, every completion to the limit) with the
  static decoder's ordinary steps and with its steps replayed from a CUDA graph
  (``TorchEngine(cuda_graphs=True)``, grpokit.rollout.graphs), and checks both against the
  trainer's forward: how far each engine's log-probs are from it, and whether the two engines
  chose the same tokens (``--rollouts-only`` runs only this, about a minute).

    bench/gpu_check.sh                      # on the GPU machine (7 minutes on an H200)
    bench/gpu_check.sh --cpu-smoke          # tiny models, float32 on CPU: the same code path
    bench/gpu_check.sh --fill-wheels        # with network: the wheels and tokenizer it needs

With ``--cpu-smoke`` the models are tiny, each side runs in one process and measures nothing; it
keeps the script working where there is no GPU.
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    REPO,
    emit_result,
    load_average,
    median,
    peak_gpu_mib,
    peak_rss_mib,
    peak_rss_since_reset_mib,
    print_ratios,
    reset_peak_rss_mib,
    run_child,
)
from train_step import (  # noqa: E402
    SETTINGS,
    grpokit_steps,
    grpokit_trainer,
    run_trl,
)

SHAPES: dict[str, dict[str, Any]] = {
    # SmolLM2-135M's config (with the untied head the suppression needs: 163M parameters).
    "smollm2-135m": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
    },
    # Llama-3.2-1B's layers; with SmolLM2's 49k vocabulary and an untied head, 1.17B parameters.
    "llama-1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    },
}
SMOKE_SHAPES: dict[str, dict[str, Any]] = {"tiny": {}}
"""--cpu-smoke's one model: grpokit.models.tiny's default shape, 2 layers of width 64."""
GPU_SETTINGS = ["lora-beta0.04", "full-beta0.04"]
WHEELS = REPO / "bench" / "wheels"
TOKENIZER_DIR = "smollm2-tokenizer"
"""Where --fill-wheels saves the embedded model's tokenizer, inside the wheels folder."""

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
    (the versions installed here) but what ``assumed`` brings, and save the embedded model's
    tokenizer."""
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

    from grpokit.model_files.embedded import embedded_model_dir

    AutoTokenizer.from_pretrained(embedded_model_dir()).save_pretrained(dest / TOKENIZER_DIR)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(
        f"{dest}: {len(list(dest.glob('*.whl')))} wheels and the tokenizer, {size / 2**20:.0f} MiB"
    )


# ---- (b) the models -----------------------------------------------------------------------------


def suppress_end_tokens(model_dir: Path) -> list[int]:
    """Zero the output-layer rows of every token that ends a completion, in the saved weights.

    Their logit is then 0, below the largest of the other ~49k random logits at every position,
    so greedy decoding never picks them. Needs an untied head (the input embeddings of those
    tokens, which the chat template uses, stay as they were). Returns the token ids.
    """
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, GenerationConfig

    ids = {AutoTokenizer.from_pretrained(model_dir).eos_token_id}
    generation_eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    ids |= set(generation_eos if isinstance(generation_eos, list) else [generation_eos])
    end = sorted(int(i) for i in ids if i is not None)
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors = load_file(path)
        if "lm_head.weight" in tensors:
            tensors["lm_head.weight"][end] = 0
            save_file(tensors, path, metadata={"format": "pt"})
            return end
    raise RuntimeError(f"{model_dir}: no lm_head.weight (a tied head cannot be changed alone)")


def build_model(name: str, shape: dict[str, Any], tokenizer: Path, root: Path) -> Path:
    """A random-weight Llama of ``shape`` with ``tokenizer``, its end tokens suppressed; built
    once into ``root/name`` (a rerun with the same shape and tokenizer reuses it)."""
    from grpokit.models.tiny import make_tiny_model_dir

    out = root / name
    recipe = {"shape": shape, "tokenizer": str(tokenizer.resolve())}
    marker = out / "gpu_check.json"
    if marker.is_file() and json.loads(marker.read_text()) == recipe:
        return out
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    make_tiny_model_dir(tmp, seed=0, tokenizer_dir=tokenizer, tie_word_embeddings=False, **shape)
    end = suppress_end_tokens(tmp)
    (tmp / "gpu_check.json").write_text(json.dumps(recipe))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"built {name} in {time.perf_counter() - t0:.0f} s (end tokens {end} suppressed)")
    return out


def default_tokenizer() -> Path:
    carried = WHEELS / TOKENIZER_DIR
    if (carried / "tokenizer_config.json").is_file():
        return carried
    from grpokit.model_files.embedded import embedded_model_dir

    return embedded_model_dir()


# ---- (c) the runs, in child processes -----------------------------------------------------------


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


def grpokit_run(args: argparse.Namespace, setting: dict[str, Any]) -> dict[str, Any]:
    """Warm-up and measured steps, then a checkpoint and a resumed trainer's next step."""
    import gc

    from grpokit.train.trainer import GRPOTrainer

    warmup = 1
    trainer = grpokit_trainer(args, setting, max_steps=warmup + args.steps + 1)
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
    }
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
    prompts = [torch.randint(10, 1000, (20,), generator=gen).tolist() for _ in range(args.prompts)]
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


def child(args: argparse.Namespace) -> None:
    """Run ``--run MODEL_DIR=SETTING`` items for one library; print their results."""
    import gc

    results = []
    for item in args.run:
        path, setting = item.rsplit("=", 1)
        run_args = copy.copy(args)
        run_args.model_path = path
        _reset_gpu_peak(args.device)
        if args.child == "graphs":
            results.append(graph_rollouts(run_args))
        else:
            fn = grpokit_run if args.child == "grpokit" else run_trl
            results.append(fn(run_args, SETTINGS[setting]))
        gc.collect()
    emit_result({"runs": results})


# ---- (d) the report -----------------------------------------------------------------------------


def _memory(r: dict[str, Any]) -> tuple[float, str]:
    if r.get("gpu_peak_mib") is not None:
        return r["gpu_peak_mib"], "GPU"
    return r["rss_mib"], "RSS"


def report_run(model: str, setting: str, peer: str, r: dict[str, Any], per_step: int) -> None:
    step = median(r["step_times"])
    tokens = per_step * r["mean_length"] / step
    memory, kind = _memory(r)
    print(
        f"{model:<13} {setting:<14} {peer:<8} {step:8.2f} s/step {tokens:10.0f} tokens/s "
        f"peak {kind} {memory / 1024:6.2f} GiB  completion {r['mean_length']:.1f} tokens "
        f"(steps {', '.join(f'{t:.2f}' for t in r['step_times'])})",
        flush=True,
    )
    if "phases" in r:  # where a grpokit step spends its time (medians of the measured steps)
        spent = ", ".join(f"{p} {t:.2f} s" for p, t in r["phases"].items())
        print(f"{'':<13} {'':<14} {'':<8} {spent}", flush=True)
    if "phase_peaks_mib" in r:  # which phase sets the peak
        peaks = ", ".join(f"{p} {m / 1024:.2f} GiB" for p, m in r["phase_peaks_mib"].items())
        print(f"{'':<13} {'':<14} {'':<8} peak {kind} in {peaks}", flush=True)
    if "checkpoint" in r:
        print(
            f"{'':<13} {'':<14} {'':<8} {r['checkpoint']} written in {r['save_s']:.1f} s; "
            f"resumed at step {r['resumed_at']} (loaded in {r['load_s']:.1f} s), step "
            f"{r['after_resume']} in {r['resumed_step_times'][0]:.2f} s",
            flush=True,
        )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny models, float32 on CPU")
    ap.add_argument("--models", nargs="+", help=f"shapes to run (default {', '.join(SHAPES)})")
    ap.add_argument("--settings", nargs="+", default=GPU_SETTINGS, choices=list(SETTINGS))
    ap.add_argument("--steps", type=int, default=2, help="measured steps (after 1 warm-up)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--tokenizer", type=Path, help="tokenizer dir (default: carried or embedded)")
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
    ap.add_argument("--child", choices=["grpokit", "trl", "graphs"], help=argparse.SUPPRESS)
    ap.add_argument("--run", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    # train_step's harness reads these too.
    args.gradient_checkpointing, args.top_k = False, 1
    return args


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
        shapes = {n: SMOKE_SHAPES[n] for n in args.models or SMOKE_SHAPES}
        args.device, args.bf16 = "cpu", False
        args.steps, args.prompts, args.num_generations, args.max_completion_length = 1, 1, 4, 8
        work = args.work or Path(tempfile.mkdtemp(prefix="grpokit-gpu-check-"))
        if args.work is None:
            atexit.register(shutil.rmtree, work, ignore_errors=True)
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device here; bench/gpu_check.sh --cpu-smoke runs the same on CPU")
        shapes = {n: SHAPES[n] for n in args.models or SHAPES}
        args.device, args.bf16 = "cuda", True
        work = args.work or REPO / "bench" / ".gpu-check"
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(
        f"torch {torch.__version__} on {device}; "
        f"{'bfloat16' if args.bf16 else 'float32'}; {args.prompts} prompt(s) x "
        f"{args.num_generations} completions of exactly {args.max_completion_length} tokens "
        f"(greedy, end tokens suppressed); 1 warm-up + {args.steps} measured steps; "
        f"{load_average()}",
        flush=True,
    )
    (work / "models").mkdir(parents=True, exist_ok=True)
    tokenizer = args.tokenizer or default_tokenizer()
    models = {n: build_model(n, s, tokenizer, work / "models") for n, s in shapes.items()}

    common = [
        f"--steps={args.steps}",
        f"--prompts={args.prompts}",
        f"--num-generations={args.num_generations}",
        f"--max-completion-length={args.max_completion_length}",
        f"--threads={args.threads}",
        f"--device={args.device}",
    ] + (["--bf16"] if args.bf16 else [])
    runs = [] if args.rollouts_only else [(m, s) for m in models for s in args.settings]
    # On the GPU each run gets its own process (its peak memory is its own); the smoke test
    # runs each library's runs in one process, to stay short.
    groups = ([runs] if runs else []) if args.cpu_smoke else [[r] for r in runs]
    results: dict[tuple[str, str, str], dict[str, Any]] = {}
    script = Path(__file__).resolve()
    per_step = args.prompts * args.num_generations
    print(f"\n{'model':<13} {'setting':<14} {'library':<8}", flush=True)
    failed: list[str] = []
    for group in groups:
        items = ["--run", *(f"{models[m]}={s}" for m, s in group)]
        for peer in ("grpokit", "trl"):
            # A run that fails is reported and the others go on: the first run on a new machine
            # should bring back every figure it can, not only the first error.
            try:
                out = run_child(script, [*common, f"--child={peer}", *items])["runs"]
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                names = ", ".join(f"{m} {s}" for m, s in group)
                print(f"FAILED {peer} on {names}: {err}", flush=True)
                failed.append(f"{peer} on {names}")
                continue
            for (m, s), r in zip(group, out, strict=True):
                results[(m, s, peer)] = r
                report_run(m, s, peer, r, per_step)

    ratios: list[tuple[str, float, str]] = []
    for m, s in runs:
        if (m, s, "grpokit") not in results or (m, s, "trl") not in results:
            continue
        ours, theirs = results[(m, s, "grpokit")], results[(m, s, "trl")]
        same = ours["mean_length"] == theirs["mean_length"] == args.max_completion_length
        work_note = "same tokens" if same else "DIFFERENT completion lengths"
        t = median(ours["step_times"]) / median(theirs["step_times"])
        rate = ours["mean_length"] / theirs["mean_length"] / t
        ratios.append((f"{m} {s}: grpokit / TRL seconds per step", t, work_note))
        ratios.append((f"{m} {s}: grpokit / TRL tokens per second", rate, "higher is faster"))
        mine, kind = _memory(ours)
        ratios.append((f"{m} {s}: grpokit / TRL peak {kind} memory", mine / _memory(theirs)[0], ""))
    if ratios:
        print_ratios("GPU check ratios", ratios)

    print(f"\n== rollouts: ordinary steps against CUDA-graph steps ({load_average()})")
    for m in models:
        try:
            r = run_child(script, [*common, "--child=graphs", "--run", f"{models[m]}=rollout"])
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            print(f"FAILED the rollouts of {m}: {err}", flush=True)
            failed.append(f"the rollouts of {m}")
            continue
        report_graphs(m, r["runs"][0], args.max_completion_length, args.device)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if failed:
        sys.exit(f"{len(failed)} run(s) failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
