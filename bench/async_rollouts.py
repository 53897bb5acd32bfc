"""Generating one step ahead (``training.max_staleness: 1``) against the synchronous loop, on a
vLLM server, CPU.

The vLLM server (``grpokit vllm-serve``) runs on CPU core 0 (``taskset`` and vLLM's own thread
binding), the trainer on core 1, one thread each: the synchronous loop leaves one core idle
while the other generates or trains; generating ahead lets the server sample step k+1 while the
trainer updates on step k. Each pair of runs trains the same config for ``--steps`` steps with
``max_staleness`` 0, then 1, on the same server; a run's figure is the median seconds per step
after its first (which has nothing to overlap), and the ratio sync / ahead is paired run by run.
Load from ``uptime``: on a shared machine, other work takes the cores too.

Needs vLLM: ``.venv-vllm/bin/python bench/async_rollouts.py`` (docs/vllm.md).

    .venv-vllm/bin/python bench/async_rollouts.py              # embedded SmolLM2-135M
    .venv-vllm/bin/python bench/async_rollouts.py --smoke      # tiny random model, one pair
    .venv-vllm/bin/python bench/async_rollouts.py --pairs 4 --steps 6
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    QUESTIONS,
    VLLM_TINY_SHAPE,
    load_average,
    median,
    model_path,
    paired_ratios,
    print_paired,
    spread,
)
from train_step import REWARD_SOURCE  # noqa: E402

from grpokit.config import load_config  # noqa: E402
from grpokit.rollout.vllm_engine import _free_port  # noqa: E402
from grpokit.rollout.vllm_server import start_server  # noqa: E402
from grpokit.train.trainer import GRPOTrainer  # noqa: E402

SERVER_CORE, TRAINER_CORE = 0, 1


def write_config(work: Path, args: argparse.Namespace, url: str, max_staleness: int) -> Path:
    (work / "reward.py").write_text(REWARD_SOURCE)
    (work / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS)
    )
    doc: dict[str, Any] = {
        "model": {"name_or_path": args.model_path, "dtype": args.dtype},
        "data": {"train": "train.jsonl", "shuffle": False},
        "rewards": [{"type": "python", "name": "brevity", "function": "reward.py:brevity"}],
        "training": {
            "use_vllm": True,
            "vllm_mode": "server",
            "vllm_server_base_url": url,
            "max_staleness": max_staleness,
            "num_generations": args.num_generations,
            "per_device_train_batch_size": args.num_generations * args.prompts,
            "max_completion_length": args.max_completion_length,
            "learning_rate": 1e-6,
            "max_steps": args.steps,
            "report_to": ["none"],
            "log_completions": False,
            "output_dir": str(work / f"run-{max_staleness}"),
        },
    }
    path = work / f"config-{max_staleness}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(config: Path, steps: int) -> tuple[list[float], list[float]]:
    """Seconds per step (after the first) and the steps' staleness."""
    trainer = GRPOTrainer(load_config(config), progress=False, log=lambda m: None)
    try:
        records = [trainer.step()[0] for _ in range(steps)]
    finally:
        trainer.close()
    return [r["step_time"] for r in records[1:]], [r.get("staleness", 0.0) for r in records]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir or name (default: embedded SmolLM2)")
    ap.add_argument("--smoke", action="store_true", help="tiny random model, 1 pair of 3 steps")
    ap.add_argument("--pairs", type=int, default=3, help="pairs of runs (sync, then ahead)")
    ap.add_argument("--steps", type=int, default=5, help="steps per run (the first not counted)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step")
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=32)
    ap.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    ap.add_argument("--threads", type=int, default=1, help="the trainer's torch threads")
    args = ap.parse_args()
    if args.smoke:
        args.pairs, args.steps, args.max_completion_length = 1, 3, 8
    args.model_path = model_path(args.smoke, args.model, **VLLM_TINY_SHAPE)
    cores = os.sched_getaffinity(0)
    if not {SERVER_CORE, TRAINER_CORE} <= cores:
        sys.exit(f"needs CPU cores {SERVER_CORE} and {TRAINER_CORE}; this process may use {cores}")
    work = Path(tempfile.mkdtemp(prefix="grpokit-bench-async-"))
    port = _free_port()
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(SERVER_CORE)  # vLLM's compute threads
    cmd = ["taskset", "-c", str(SERVER_CORE), sys.executable, "-m", "grpokit", "vllm-serve"]
    cmd += ["--model", args.model_path, "--port", str(port), "--dtype", args.dtype]
    cmd += ["--memory-share", "0.05", "--max-num-seqs", str(args.prompts * args.num_generations)]
    cmd += ["--host", "127.0.0.1"]
    server = start_server(cmd, log=work / "server.log", timeout=600)
    try:
        os.sched_setaffinity(0, {TRAINER_CORE})
        torch.set_num_threads(args.threads)
        url = f"http://127.0.0.1:{port}"
        print(
            f"model {args.model_path}; dtype {args.dtype}; {args.prompts} prompts x "
            f"{args.num_generations} completions of up to {args.max_completion_length} tokens; "
            f"server on core {SERVER_CORE}, trainer on core {TRAINER_CORE}; {args.pairs} pairs "
            f"of {args.steps} steps; {load_average()}",
            flush=True,
        )
        per_run: dict[int, list[float]] = {0: [], 1: []}
        for pair in range(args.pairs):
            for staleness in (0, 1):
                times, stale = run(write_config(work, args, url, staleness), args.steps)
                per_run[staleness].append(median(times))
                print(
                    f"pair {pair} max_staleness {staleness}: {spread(times)} s/step; staleness "
                    f"{', '.join(f'{s:.0f}' for s in stale)} ({load_average()})",
                    flush=True,
                )
        for staleness, label in ((0, "synchronous"), (1, "one step ahead")):
            print(f"{label:<15} median s/step over runs: {spread(per_run[staleness])}")
        print_paired(
            "generating one step ahead against the synchronous loop",
            [
                (
                    "synchronous / ahead seconds per step",
                    paired_ratios(per_run[0], per_run[1]),
                    "above 1.0 generating ahead is the faster",
                )
            ],
        )
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:  # seen under heavy load: its shutdown hangs
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
