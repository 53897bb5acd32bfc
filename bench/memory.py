"""Where a grpokit step's peak memory goes at a 128k vocabulary, and what the memory settings save.

The model and step of ``scaling.py --vs-trl`` (a random-weight Llama with Llama 3's 128,256-token
vocabulary on a 155M-parameter body; 1 prompt x G = 8 completions of exactly L tokens; full
fine-tuning, beta 0.04, ``model.dtype: auto``), once per memory setting, each in a fresh process:

- ``default``: grpokit's defaults (``logprob_chunk_size`` 1,024, no gradient checkpointing);
- ``chunk256``: ``training.logprob_chunk_size: 256``;
- ``checkpointing``: ``model.gradient_checkpointing: true``;
- ``both``: the two together;
- ``lean``: both, and ``model.return_freed_memory`` (freed blocks of 1 MiB and more go back to
  the system at once).

A thread samples the process's resident memory every 20 ms and keeps the peak of each phase of
the step: the rollout, the reference model's log-probs, the policy's forward, the backward pass
and the optimizer step. The first optimizer step creates AdamW's state, so the last measured
step is the steady one. The tensors the policy's forward keeps for the backward pass are added
up by kind (tensors of the vocabulary's size: the last chunk's logits; of the MLP's width; of
the hidden size, in float32 and bfloat16; of the head size), each storage counted once.

    python bench/memory.py --threads 2                   # L 1,024, the four settings, 2 steps
    python bench/memory.py --lengths 256 1024 --settings default both
    python bench/memory.py --smoke                       # tiny model, default and both (tests)

A real model instead (its end tokens suppressed in a copy, bench/.fixed-length, so that greedy
completions run to L), with LoRA r 16 and 4 completions as ``train_step.py`` measures it (add
``--lengths 256 --settings default --threads 2`` for its 0.5B figure):

    python bench/memory.py --model qwen2.5-coder-0.5b-instruct --lora --num-generations 4

Prints per setting the phase peaks and the kept tensors, then each setting's peak against the
default's last.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    REPO,
    emit_result,
    fixed_length_copy,
    load_average,
    model_path,
    print_ratios,
    run_child,
)
from train_step import SETTINGS, grpokit_trainer  # noqa: E402

MEMORY_SETTINGS: dict[str, dict[str, Any]] = {
    "default": {"checkpointing": False, "training": {}},
    "chunk256": {"checkpointing": False, "training": {"logprob_chunk_size": 256}},
    "checkpointing": {"checkpointing": True, "training": {}},
    "both": {"checkpointing": True, "training": {"logprob_chunk_size": 256}},
    "lean": {"checkpointing": True, "training": {}, "lean_memory": True},
}
PHASES = ("rollout", "reference log-probs", "policy forward", "backward", "optimizer step")
GIB = 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model, L 8, 1 step")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024])
    ap.add_argument(
        "--settings", nargs="+", default=list(MEMORY_SETTINGS), choices=list(MEMORY_SETTINGS)
    )
    ap.add_argument("--steps", type=int, default=2, help="steps per run (the last is reported)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--model", help="a model name or directory (default: the random 128k model)")
    ap.add_argument(
        "--lora",
        action="store_true",
        help="LoRA r 16 as train_step.py sets it, not full fine-tuning",
    )
    ap.add_argument("--num-generations", type=int, default=8, help="completions of the one prompt")
    ap.add_argument("--child", choices=list(MEMORY_SETTINGS), help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        emit_result(measure(args))
        return
    step = (
        f"1 prompt x {args.num_generations} completions of exactly L tokens; "
        f"{'LoRA r 16' if args.lora else 'full fine-tuning'}, beta 0.04; {args.steps} step(s) "
        f"per run, the last reported; {args.threads or 'default'} thread(s)"
    )
    if args.model:
        path = fixed_length_copy(model_path(False, args.model), REPO / "bench" / ".fixed-length")
        print(f"model {args.model}; {step}; {load_average()}", flush=True)
        compare(args, Path(path))
        return
    from gpu_check import Shape, build_model
    from scaling import VOCAB_SHAPE

    from grpokit.hub.embedded import embedded_model_dir

    shape = VOCAB_SHAPE
    if args.smoke:
        shape, args.lengths, args.steps = {"vocab_size": 65_536}, [8], 1
        args.settings = ["default", "lean"]
    root = Path(tempfile.mkdtemp(prefix="grpokit-bench-memory-"))
    try:
        # an untied head, as before the check built Qwen2 shapes; float32 on the CPU
        vocab = Shape("llama", {"tie_word_embeddings": False, **shape})
        path = build_model("vocab", vocab, embedded_model_dir(), root, "cpu", "float32")
        print(f"vocabulary {shape['vocab_size']:,}; {step}; {load_average()}", flush=True)
        compare(args, path)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def compare(args: argparse.Namespace, path: Path) -> None:
    ratios: list[tuple[str, float, str]] = []
    for length in args.lengths:
        peaks: dict[str, float] = {}
        for name in args.settings:
            r = run_child(
                Path(__file__).resolve(),
                [
                    f"--child={name}",
                    f"--model-path={path}",
                    f"--length={length}",
                    f"--steps={args.steps}",
                    f"--threads={args.threads}",
                    f"--num-generations={args.num_generations}",
                    *(["--lora"] if args.lora else []),
                ],
                timeout=7200,
            )
            peaks[name] = r["peak_gib"]
            phases = ", ".join(f"{p} {r['phases'].get(p, 0.0):.2f}" for p in PHASES)
            print(
                f"L {length:5d}  {name:<13} peak {r['peak_gib']:.2f} GiB; weights loaded "
                f"{r['loaded_gib']:.2f}; phase peaks (GiB): {phases}; step {r['seconds']:.0f} s "
                f"({load_average()})",
                flush=True,
            )
            kept = "; ".join(
                f"{k} {v / 2**20:.0f}" for k, v in sorted(r["kept"].items(), key=lambda kv: -kv[1])
            )
            print(f"         kept by the forward for the backward (MiB): {kept}", flush=True)
        for name in args.settings:
            if name != "default" and "default" in peaks:
                ratios.append(
                    (
                        f"L {length}: {name} / default, peak memory",
                        peaks[name] / peaks["default"],
                        f"{peaks[name]:.2f} vs {peaks['default']:.2f} GiB",
                    )
                )
    print_ratios("peak memory against grpokit's defaults", ratios)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One run (this process): the last step's phase peaks and kept tensors."""
    setting = MEMORY_SETTINGS[args.child]
    ns = argparse.Namespace(
        model_path=args.model_path,
        threads=args.threads,
        num_generations=args.num_generations,
        prompts=1,
        max_completion_length=args.length,
        top_k=1,
        bf16=False,
        device="cpu",
        gradient_checkpointing=setting["checkpointing"],
        lean_memory=setting.get("lean_memory", False),
    )
    trainer = grpokit_trainer(
        ns,
        SETTINGS["lora-beta0.04" if args.lora else "full-beta0.04"],
        max_steps=args.steps,
        training=setting["training"],
    )
    meter = PhaseMeter()
    loaded = meter.resident()
    kept: collections.Counter[str] = collections.Counter()
    model = trainer.policy.model
    hidden = int(model.config.hidden_size)
    weights = {tuple(p.shape) for p in model.parameters()}
    _instrument(trainer, meter, lambda: _saved_tensors_counted(kept, hidden, weights))
    seconds = 0.0
    for _ in range(args.steps):
        meter.reset()
        kept.clear()
        t0 = time.perf_counter()
        trainer.step()
        seconds = time.perf_counter() - t0
    meter.stop()
    return {
        "peak_gib": max(meter.peaks.values()) / GIB,
        "loaded_gib": loaded / GIB,
        "phases": {k: v / GIB for k, v in meter.peaks.items()},
        "kept": dict(kept),
        "seconds": seconds,
    }


class PhaseMeter:
    """The peak resident memory of each named phase, sampled by a thread every 20 ms."""

    def __init__(self) -> None:
        self.phase = "other"
        self.peaks: dict[str, float] = {}
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def resident(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def reset(self) -> None:
        self.peaks = {}

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self._record()

    def _record(self) -> None:
        value, phase = self.resident(), self.phase
        if value > self.peaks.get(phase, 0.0):
            self.peaks[phase] = value

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self._record()  # a phase shorter than the sampling interval still gets a value
            self.phase = before


def _instrument(trainer: Any, meter: PhaseMeter, counting: Callable[[], Any]) -> None:
    """Wrap the trainer's phases (instance attributes, so only this trainer is touched)."""
    import torch

    def wrapped(fn: Callable[..., Any], phase: str, count: bool = False) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            with meter.during(phase):
                if count and torch.is_grad_enabled():
                    with counting():
                        return fn(*a, **k)
                return fn(*a, **k)

        return run

    trainer.collect = wrapped(trainer.collect, "rollout")
    trainer._fixed_logprobs = wrapped(trainer._fixed_logprobs, "reference log-probs")
    trainer._apply_gradients = wrapped(trainer._apply_gradients, "optimizer step")
    logprobs = trainer._logprobs
    forward = wrapped(logprobs, "policy forward", count=True)
    # Under no_grad (the reference's log-probs) it stays in the phase it is called from.
    trainer._logprobs = lambda *a, **k: (forward if torch.is_grad_enabled() else logprobs)(*a, **k)
    backward = wrapped(torch.autograd.backward, "backward")
    loss_and_backward = trainer._loss_and_backward

    def with_backward(*a: Any, **k: Any) -> Any:
        original, torch.autograd.backward = torch.autograd.backward, backward
        try:
            return loss_and_backward(*a, **k)
        finally:
            torch.autograd.backward = original

    trainer._loss_and_backward = with_backward


def _saved_tensors_counted(
    kept: collections.Counter[str], hidden: int, weights: set[tuple[int, ...]]
) -> Any:
    """A context in which every tensor autograd saves is added to ``kept`` (bytes) by kind, each
    storage once: the parameters themselves are not counted, their bfloat16 copies (autocast's)
    are. Tensors saved inside a checkpointed region are not seen (they are not kept)."""
    import torch

    seen: set[tuple[int, int]] = set()

    def kind(t: torch.Tensor) -> str:
        last = int(t.shape[-1]) if t.dim() else 0
        dtype = str(t.dtype).removeprefix("torch.")
        if not t.is_floating_point():
            return "integer"
        if t.dim() == 2 and tuple(t.shape) in weights:
            return f"weights in {dtype}"
        if last >= 16 * hidden:
            return "vocabulary-sized (logits)"
        if last > hidden:
            return f"MLP-width {dtype}"
        if last == hidden:
            return f"hidden-size {dtype}"
        return f"other {dtype}"

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen and not isinstance(t, torch.nn.Parameter):
            seen.add(key)
            kept[kind(t)] += storage.nbytes()
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


if __name__ == "__main__":
    main()
