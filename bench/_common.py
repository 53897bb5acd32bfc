"""Shared pieces of the benchmarks: the model under test, prompts, timing, reporting.

Benchmarks compare grpokit with a peer measured in the same script, on the same prompts, with
runs interleaved, so that a busy machine slows both sides alike. On a shared machine one step can
take 2-4x another, so a comparison is the median of at least :data:`MIN_MEASURED` paired ratios
(step k of one side against step k of the other, after warm-up), printed with their spread; every
report line carries the load average, since absolute numbers on a shared machine mean little.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

QUESTIONS = [
    "What is 17 + 25? Answer with the number.",
    "Name three rivers in Europe.",
    "Write one sentence about the moon.",
    "What is the capital of Japan?",
    "Explain in one line what a prime number is.",
    "What is 9 times 7?",
    "Give a synonym for 'happy'.",
    "Say hello in French.",
    "What colour is the sky on a clear day?",
    "Count from one to five.",
    "What is 100 minus 37?",
    "Name a fruit that is yellow.",
    "What is the opposite of 'cold'?",
    "Write a four-word sentence.",
    "What is 12 divided by 4?",
    "Which planet is closest to the sun?",
]

REPO = Path(__file__).resolve().parents[1]


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


VLLM_TINY_SHAPE = {"num_attention_heads": 2, "num_key_value_heads": 1}
"""The tiny model's shape changed so that vLLM's CPU attention takes it (head size 32, not 16)."""


def model_path(smoke: bool, model: str | None, **tiny_shape: Any) -> str:
    """The model a benchmark runs: the given one, the embedded SmolLM2 (converted once), or with
    ``smoke`` a tiny random model with SmolLM2's tokenizer (a temporary directory), its config
    changed by ``tiny_shape``."""
    if model:
        from grpokit.hub.resolve import resolve_model_path

        return resolve_model_path(model)
    from grpokit.hub.embedded import embedded_model_dir

    if smoke:
        from grpokit.models.tiny import make_tiny_model_dir

        out = Path(tempfile.mkdtemp(prefix="grpokit-bench-tiny-"))
        return str(
            make_tiny_model_dir(out, seed=0, tokenizer_dir=embedded_model_dir(), **tiny_shape)
        )
    return str(embedded_model_dir())


def chat_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """``n`` chat-formatted prompts (token ids), cycling through :data:`QUESTIONS`."""
    from grpokit.data.chat import encode_prompt

    return [encode_prompt(tokenizer, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


MIN_MEASURED = 6
"""Measured repeats (after warm-up) a benchmark takes by default: the median of 6 paired ratios
stays put when one or two of them are hit by a load spike."""


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def paired_ratios(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """Repeat k of one side over repeat k of the other (same prompts, run close in time)."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} repeats against {len(theirs)}: cannot pair them")
    return [a / b for a, b in zip(ours, theirs, strict=True)]


def spread(values: Sequence[float], digits: int = 2) -> str:
    """'median (min-max of n)': the figure and how far single repeats strayed from it."""
    if not values:
        return "no repeats"
    f = f"{{:.{digits}f}}"
    return (
        f"{f.format(median(values))} ({f.format(min(values))}-{f.format(max(values))} "
        f"of {len(values)})"
    )


def verdict(value: float, target: float, *, at_least: bool) -> str:
    ok = value >= target if at_least else value <= target
    return f"target {'>=' if at_least else '<='} {target} ({'meets' if ok else 'MISSES'})"


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # "VmHWM:  123456 kB"
    raise OSError(f"no {field} in /proc/self/status")


def reset_peak_rss_mib() -> float:
    """Set this process's peak resident memory back to its current one and return it, so that
    :func:`peak_rss_since_reset_mib` then measures what follows alone: a peak reached while
    loading would otherwise hide a smaller one after it. Linux only (``/proc/self/clear_refs``);
    elsewhere the peak so far."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_mib("VmHWM")
    except OSError:
        return peak_rss_mib()


def peak_rss_since_reset_mib() -> float:
    """Peak resident memory since :func:`reset_peak_rss_mib` (the peak so far without it)."""
    try:
        return _status_mib("VmHWM")
    except OSError:
        return peak_rss_mib()


def peak_gpu_mib() -> float | None:
    """Peak GPU memory allocated by this process's tensors so far (None without CUDA)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def emit_result(result: dict[str, Any]) -> None:
    """How a child process hands its measurement to :func:`run_child`."""
    print("RESULT " + json.dumps(result), flush=True)


def run_child(script: Path, args: list[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``python script args`` in a fresh process (so its peak memory is its own)."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            parsed: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return parsed
    raise RuntimeError(
        f"{script.name} {' '.join(args)} failed (exit {proc.returncode}):\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )


LOCKSTEP_ENV = "GRPOKIT_BENCH_LOCKSTEP"
"""Set in a child that :func:`run_children_in_lockstep` runs: it waits for its turn before each
step (:func:`wait_turn`) and reports the step's end (:func:`turn_done`)."""
_DONE = "STEP DONE"


def wait_turn() -> None:
    """In a lockstep child, block until the parent says this child's next step may start."""
    if os.environ.get(LOCKSTEP_ENV):
        sys.stdin.readline()


def turn_done() -> None:
    """In a lockstep child, tell the parent that a step has ended."""
    if os.environ.get(LOCKSTEP_ENV):
        print(_DONE, flush=True)


def run_children_in_lockstep(
    script: Path, children: dict[str, list[str]], steps: int, timeout: float = 1800
) -> dict[str, dict[str, Any] | RuntimeError]:
    """Run one child process per name (``python script args``, each loaded once and alive
    together) and let them take turns, step by step: step k of every child runs before step
    k + 1 of any, one child at a time. A machine whose speed drifts over minutes (other jobs, a
    host shared with other machines) then slows step k of both peers alike, where children run
    one after the other would each see a different machine. Each child's peak memory is still its
    own. ``steps``: every step a child takes, warm-up included.

    Returns:
        Per name, the child's result (see :func:`emit_result`), or the error it failed with (the
        others go on without it).
    """
    with contextlib.ExitStack() as stack:
        return _lockstep(script, children, steps, timeout, stack)


def _lockstep(
    script: Path,
    children: dict[str, list[str]],
    steps: int,
    timeout: float,
    stack: contextlib.ExitStack,
) -> dict[str, dict[str, Any] | RuntimeError]:
    procs: dict[str, subprocess.Popen[str]] = {}
    logs: dict[str, Any] = {}
    env = {**os.environ, LOCKSTEP_ENV: "1"}
    for name, args in children.items():
        # Closed by the caller's ExitStack (one file per child, open until they all end).
        logs[name] = stack.enter_context(tempfile.TemporaryFile("w+"))  # noqa: SIM115
        procs[name] = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=logs[name],
            text=True,
            cwd=REPO,
            env=env,
        )
    out: dict[str, dict[str, Any] | RuntimeError] = {}
    kept: dict[str, list[str]] = {name: [] for name in children}

    def read_until(name: str, marker: str) -> bool:
        """Read the child's stdout up to a line starting with ``marker``; False at its end."""
        stdout = procs[name].stdout
        assert stdout is not None
        for line in stdout:
            kept[name].append(line)
            if line.startswith(marker):
                return True
        return False

    def fail(name: str) -> None:
        procs[name].kill()
        procs[name].wait()
        logs[name].seek(0)
        err = logs[name].read()[-3000:]
        out[name] = RuntimeError(
            f"{script.name} {' '.join(children[name])} failed (exit {procs[name].returncode}):"
            f"\n{''.join(kept[name])[-3000:]}\n{err}"
        )

    start = time.monotonic()
    for _ in range(steps):
        for name, proc in procs.items():
            if name in out:
                continue
            if time.monotonic() - start > timeout:
                fail(name)
                continue
            assert proc.stdin is not None
            try:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            except BrokenPipeError:
                fail(name)
                continue
            if not read_until(name, _DONE):
                fail(name)
    for name, proc in procs.items():
        if name in out:
            continue
        if read_until(name, "RESULT "):
            out[name] = json.loads(kept[name][-1][len("RESULT ") :])
            proc.wait()
        else:
            fail(name)
    return out


def print_ratios(title: str, ratios: list[tuple[str, float, str]]) -> None:
    """The closing block every benchmark prints last: name, ratio, target/verdict."""
    print(f"\n== {title} ({load_average()})")
    for name, value, note in ratios:
        print(f"{name:<60} {value:8.2f}x  {note}")


def print_paired(title: str, pairs: list[tuple[str, list[float], str]]) -> None:
    """The closing block of a paired benchmark: per comparison, the median of its paired ratios,
    their spread and the note (target / verdict), then the ratios themselves."""
    print(f"\n== {title} ({load_average()})")
    for name, ratios, note in pairs:
        print(f"{name:<60} {median(ratios):8.2f}x  {note}; {spread(ratios)}")
    print("paired ratios, repeat by repeat:")
    for name, ratios, _ in pairs:
        print(f"  {name}: " + " ".join(f"{r:.2f}" for r in ratios))


def _safetensors_header(path: Path) -> tuple[int, dict[str, Any]]:
    """Where the tensors' bytes start in a safetensors file, and its header: name -> dtype,
    shape, data_offsets (from that start)."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return 8 + size, header


def zero_rows(path: Path, name: str, rows: Sequence[int]) -> bool:
    """Zero ``rows`` of the tensor ``name`` in a safetensors file, in place: only those rows'
    bytes are written (the 7B shape's file is 15 GB). False where the file does not hold it."""
    start, header = _safetensors_header(path)
    if name not in header:
        return False
    first, last = header[name]["data_offsets"]
    row_bytes = (last - first) // header[name]["shape"][0]
    with path.open("r+b") as f:
        for row in rows:
            f.seek(start + first + row * row_bytes)
            f.write(bytes(row_bytes))
    return True


def suppress_end_tokens(model_dir: Path) -> tuple[list[int], int]:
    """Zero the output-layer rows of every token that ends a completion, and of the ids past the
    tokenizer's vocabulary, in the saved weights.

    Their logit is then 0, below the largest of the other random logits (tens of thousands) at
    every position, so greedy decoding never picks them. The ids past the tokenizer (the 7B's
    head has 152,064 rows, 128 more than the carried tokenizer's tokens) decode to nothing:
    zeroed, every completion is text, as a trained model's is.

    Where the head is tied to the input embeddings (Qwen2.5 0.5B and 1.5B; the file holds
    ``model.embed_tokens.weight`` alone) the rows zeroed are the embeddings': the end tokens' input
    embedding is zero too. Prompts hold one (the chat template closes each turn with it), where a
    random model reads a zero vector instead of a random one, which its first norm keeps zero: the
    same work, on both sides. Returns the end token ids and how many ids past the tokenizer.
    """
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    ids = {tokenizer.eos_token_id}
    generation_eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    ids |= set(generation_eos if isinstance(generation_eos, list) else [generation_eos])
    end = sorted(int(i) for i in ids if i is not None)
    past = range(len(tokenizer), config.vocab_size)
    name = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    for path in sorted(model_dir.glob("*.safetensors")):
        if zero_rows(path, name, [*end, *past]):
            return end, len(past)
    raise RuntimeError(f"{model_dir}: no {name} in its safetensors files")


def fixed_length_copy(model_dir: str, work: Path) -> str:
    """A copy of ``model_dir`` under ``work`` whose end tokens are suppressed
    (:func:`suppress_end_tokens`), made once: greedy completions of a real model end after a few
    words, so a step at 256 tokens needs them to run to the limit, on both sides alike."""
    src = Path(model_dir)
    out = work / f"{src.name}-fixed-length"
    if not (out / ".suppressed").is_file():
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(src, out)
        end, _ = suppress_end_tokens(out)
        (out / ".suppressed").write_text(json.dumps(end))
    return str(out)
