"""Seconds per GRPO step and peak memory: grpokit against TRL's GRPOTrainer on the same config.

Same model, prompts, reward, G, batch, max_completion_length, learning rate, sampling and loss
(dapo), for full fine-tuning and LoRA (r 16, alpha 32, all linear layers), beta 0 and 0.04.
Gradient checkpointing is off on both sides (TRL's default is on; ``--gradient-checkpointing``
turns it on for both). Each (peer, setting) runs in a process of its own, so its peak resident
memory is its own; the peers' processes live side by side and take turns step by step (step k of
each peer, then step k + 1), so that a machine whose speed drifts slows both alike. A step is
rollout + reward + update on both sides.

The peers: "grpokit" with ``model.dtype: auto`` (bfloat16 compute with float32 master weights on a
CPU with native bf16, float32 elsewhere), "trl" in float32 (as its CPU users run it, the target's
peer), and where bfloat16 applies, "trl-bf16" (TRL's ``bf16=True``: CPU autocast) and
"grpokit-fp32" (grpokit in float32, for bfloat16's own gain).

Both libraries take the prompts in the same order (no shuffling, one prompt per step by default),
so step k of one side and step k of the other run the same prompt: a ratio is the median of these
paired ratios over the measured steps (after one warm-up step), printed with its spread, so that
one step slowed by a load spike cannot make or break a target.

Sampling is top-k 1 by default (greedy, on both sides): the two libraries then generate the same
completions, so a step does the same work in each. With ``--top-k 0`` (plain sampling at
temperature 1) each side draws its own completions, whose lengths differ, and a step's time with
them; the per-setting lines print the mean completion length either way.

    python bench/train_step.py                 # embedded SmolLM2-135M: 1 prompt x 4, 64 tokens
    python bench/train_step.py --smoke         # tiny model, 1 setting, 1 step (the tests)
    python bench/train_step.py --steps 8 --settings full-beta0.04 lora-beta0.04

Prints per-setting lines, then the ratios last.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    MIN_MEASURED,
    QUESTIONS,
    REPO,
    emit_result,
    fixed_length_copy,
    load_average,
    median,
    model_path,
    paired_ratios,
    peak_gpu_mib,
    peak_rss_mib,
    print_paired,
    run_child,
    run_children_in_lockstep,
    spread,
    turn_done,
    verdict,
    wait_turn,
)

SETTINGS = {
    "full-beta0": {"lora": False, "beta": 0.0},
    "full-beta0.04": {"lora": False, "beta": 0.04},
    "lora-beta0": {"lora": True, "beta": 0.0},
    "lora-beta0.04": {"lora": True, "beta": 0.04},
}
LORA = {"r": 16, "alpha": 32}
TARGET_TIME = 0.35
LEAN_CHUNK = 256
"""``--lean-memory``: grpokit's log-prob chunk (positions), with ``model.return_freed_memory``."""
PEERS = ["grpokit", "trl", "grpokit-fp32", "trl-bf16"]
"""In the order they run, per setting; the last two only where grpokit computes in bfloat16."""

REWARD_SOURCE = '''
def brevity(prompts, completions, **kwargs):
    """1 for an answer of at most 20 words, less for longer ones: a cheap, varying reward."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[0]["content"]
        out.append(min(1.0, 20 / max(1, len(text.split()))))
    return out
'''


def _brevity(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    namespace: dict[str, Any] = {}
    exec(REWARD_SOURCE, namespace)  # the very function grpokit loads from its file
    result: list[float] = namespace["brevity"](prompts, completions, **kwargs)
    return result


def grpokit_trainer(
    args: argparse.Namespace,
    setting: dict[str, Any],
    max_steps: int,
    dtype: str = "auto",
    training: dict[str, Any] | None = None,
) -> Any:
    """grpokit's trainer on the benchmark's config (written to a temporary directory); ``dtype``
    is model.dtype (with ``--bf16``, training.bf16 sets bfloat16 weights instead); ``training``:
    more training fields; ``args.lean_memory``: the memory settings (:data:`LEAN_CHUNK`)."""
    import torch
    import yaml

    from grpokit.config import load_config
    from grpokit.train.trainer import GRPOTrainer

    torch.set_num_threads(args.threads) if args.threads else None
    lean = getattr(args, "lean_memory", False)
    work = Path(tempfile.mkdtemp(prefix="grpokit-bench-"))
    (work / "reward.py").write_text(REWARD_SOURCE)
    (work / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n" for q in QUESTIONS)
    )
    doc = {
        "model": {
            "name_or_path": args.model_path,
            **({} if args.bf16 else {"dtype": dtype}),
            "lora": LORA if setting["lora"] else None,
            "gradient_checkpointing": args.gradient_checkpointing,
            "device": args.device,
            **({"return_freed_memory": True} if lean else {}),
        },
        "data": {"train": "train.jsonl", "shuffle": False},
        "rewards": [{"type": "python", "name": "brevity", "function": "reward.py:brevity"}],
        "training": {
            "num_generations": args.num_generations,
            "per_device_train_batch_size": args.num_generations * args.prompts,
            "max_completion_length": args.max_completion_length,
            "beta": setting["beta"],
            "learning_rate": 1e-6,
            "loss_type": "dapo",
            "top_k": args.top_k or None,
            "bf16": args.bf16,
            "max_steps": max_steps,
            "report_to": ["none"],
            "log_completions": False,
            "output_dir": str(work / "run"),
            **({"logprob_chunk_size": LEAN_CHUNK} if lean else {}),
            **(
                {"max_tokens_per_micro_batch": args.micro_batch_tokens}
                if getattr(args, "micro_batch_tokens", None)
                else {}
            ),
            **(training or {}),
        },
    }
    (work / "config.yaml").write_text(yaml.safe_dump(doc))
    return GRPOTrainer(load_config(work / "config.yaml"), progress=False, log=lambda m: None)


PHASES = ("generate", "score", "update")
"""The phases of a grpokit step that its log records time (``time/<phase>``)."""


def grpokit_steps(trainer: Any, n: int) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """Run ``n`` steps of a grpokit trainer: each step's seconds, mean completion length and
    seconds per phase (:data:`PHASES`, from the step's log record)."""
    times, lengths = [], []
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    for _ in range(n):
        wait_turn()
        t0 = time.perf_counter()
        record = trainer.step()[0]
        times.append(time.perf_counter() - t0)
        turn_done()
        lengths.append(record["completions/mean_length"])
        for p in PHASES:
            phases[p].append(record[f"time/{p}"])
    return times, lengths, phases


def run_grpokit(
    args: argparse.Namespace, setting: dict[str, Any], warmup: int = 1, dtype: str = "auto"
) -> dict[str, Any]:
    trainer = grpokit_trainer(args, setting, max_steps=args.steps + warmup, dtype=dtype)
    times, lengths, _ = grpokit_steps(trainer, args.steps + warmup)
    return {
        "step_times": times[warmup:],
        "mean_length": median(lengths[warmup:]),
        "rss_mib": peak_rss_mib(),
        "gpu_peak_mib": peak_gpu_mib(),
    }


def run_trl(
    args: argparse.Namespace, setting: dict[str, Any], autocast: bool = False
) -> dict[str, Any]:
    """TRL's step times; ``autocast``: TRL's bf16=True on float32 weights (CPU autocast)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads) if args.threads else None
    work = Path(tempfile.mkdtemp(prefix="trl-bench-"))
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=dtype)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS])
    config = GRPOConfig(
        output_dir=str(work),
        num_generations=args.num_generations,
        per_device_train_batch_size=args.num_generations * args.prompts,
        max_completion_length=args.max_completion_length,
        beta=setting["beta"],
        learning_rate=1e-6,
        loss_type="dapo",
        top_k=args.top_k or None,
        max_steps=args.steps + 1,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=args.device == "cpu",
        bf16=args.bf16 or autocast,
        gradient_checkpointing=args.gradient_checkpointing,
        shuffle_dataset=False,
        seed=0,
    )
    peft_config = None
    if setting["lora"]:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=LORA["r"],
            lora_alpha=LORA["alpha"],
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
    times: list[float] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            wait_turn()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.perf_counter() - self.t0)
            turn_done()

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[_brevity],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[Timer()],
    )
    trainer.train()
    lengths = [
        h["completions/mean_length"]
        for h in trainer.state.log_history
        if "completions/mean_length" in h
    ]
    return {
        "step_times": times[1:],
        "mean_length": median(lengths[1:]),
        "rss_mib": peak_rss_mib(),
        "gpu_peak_mib": peak_gpu_mib(),
    }


def child(args: argparse.Namespace) -> None:
    setting = SETTINGS[args.setting]
    if args.child in ("grpokit", "grpokit-fp32"):
        dtype = "float32" if args.child == "grpokit-fp32" else "auto"
        emit_result(run_grpokit(args, setting, dtype=dtype))
    else:
        emit_result(run_trl(args, setting, autocast=args.child == "trl-bf16"))


def _setting_pairs(
    name: str, results: dict[str, dict[str, Any]]
) -> list[tuple[str, list[float], str]]:
    """The paired step-time ratios of one setting, and its peak-memory ratio."""
    ours = results["grpokit"]
    pairs: list[tuple[str, list[float], str]] = []
    if "trl" in results:
        t = paired_ratios(ours["step_times"], results["trl"]["step_times"])
        m = [ours["rss_mib"] / results["trl"]["rss_mib"]]
        pairs.append(
            (
                f"{name}: grpokit / TRL seconds per step",
                t,
                verdict(median(t), TARGET_TIME, at_least=False),
            )
        )
        pairs.append((f"{name}: grpokit / TRL peak memory", m, verdict(m[0], 1.0, at_least=False)))
    if "trl-bf16" in results:
        t = paired_ratios(ours["step_times"], results["trl-bf16"]["step_times"])
        pairs.append((f"{name}: grpokit / TRL bf16 seconds per step", t, "TRL with bf16=True"))
    if "grpokit-fp32" in results:
        t = paired_ratios(ours["step_times"], results["grpokit-fp32"]["step_times"])
        pairs.append(
            (f"{name}: grpokit bfloat16 / float32 seconds per step", t, "bfloat16's own gain")
        )
    return pairs


def _alone(script: Path, args: list[str]) -> dict[str, Any] | RuntimeError:
    """One child run to its end with nothing else of the benchmark alive beside it."""
    try:
        return run_child(script, args, timeout=3600)
    except RuntimeError as e:
        return e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None, help="model dir or name (default: embedded SmolLM2)")
    ap.add_argument("--smoke", action="store_true", help="tiny model, one setting, one step")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument(
        "--steps", type=int, default=MIN_MEASURED, help="measured steps (after 1 warm-up)"
    )
    ap.add_argument("--prompts", type=int, default=1, help="prompts per step")
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=64)
    ap.add_argument(
        "--fixed-length",
        action="store_true",
        help="suppress the end tokens (a copy of the model in bench/.fixed-length): every "
        "completion runs to the limit; a real model's answers end after a few words",
    )
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument(
        "--lean-memory",
        action="store_true",
        help="grpokit: logprob_chunk_size 256 and model.return_freed_memory",
    )
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="grpokit: training.max_tokens_per_micro_batch (the update's rows cut into "
        "micro-batches of at most this many padded tokens; the same update, less activation "
        "memory); TRL has no such setting",
    )
    ap.add_argument(
        "--top-k", type=int, default=1, help="1: greedy, equal work on both sides; 0: sampling"
    )
    ap.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="run the peers one after the other, each alone in memory, instead of alive together "
        "taking turns: for settings two of which do not fit the machine together (full "
        "fine-tuning of a 0.5B model in float32 on 24 GiB); a drift of the machine's speed is "
        "then not paired away",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine")
    ap.add_argument("--bf16", action="store_true", help="bfloat16 weights on both sides")
    ap.add_argument("--peers", nargs="+", choices=PEERS, help="(default: all that apply here)")
    ap.add_argument("--child", choices=PEERS, help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    import torch

    from grpokit.models.onednn import bf16_compute_applies

    # model.dtype: auto computes in bfloat16 on a CPU that has it (not with bfloat16 weights).
    bf16 = args.device == "cpu" and not args.bf16 and bf16_compute_applies(torch.device("cpu"))
    if args.smoke:
        args.settings, args.steps, args.max_completion_length = ["full-beta0.04"], 1, 8
        args.peers = args.peers or ["grpokit", "trl"]
    peers = args.peers or (PEERS if bf16 else ["grpokit", "trl"])
    path = model_path(args.smoke, args.model)
    if args.fixed_length:
        path = fixed_length_copy(path, REPO / "bench" / ".fixed-length")
    common = [
        f"--model-path={path}",
        f"--steps={args.steps}",
        f"--prompts={args.prompts}",
        f"--num-generations={args.num_generations}",
        f"--max-completion-length={args.max_completion_length}",
        f"--threads={args.threads}",
        f"--top-k={args.top_k}",
        f"--device={args.device}",
    ] + (["--gradient-checkpointing"] if args.gradient_checkpointing else [])
    common += ["--lean-memory"] if args.lean_memory else []
    if args.micro_batch_tokens:
        common += [f"--micro-batch-tokens={args.micro_batch_tokens}"]
    common += ["--bf16"] if args.bf16 else []
    print(
        f"model {path}; {args.prompts} prompt(s) x {args.num_generations} generations, up to "
        f"{args.max_completion_length} tokens; top-k {args.top_k}; {args.steps} measured steps; "
        f"grpokit computes in {'bfloat16' if bf16 or args.bf16 else 'float32'}; "
        f"{load_average()}"
    )
    pairs: list[tuple[str, list[float], str]] = []
    script = Path(__file__).resolve()
    for name in args.settings:
        results: dict[str, dict[str, Any]] = {}
        children = {peer: [*common, f"--child={peer}", f"--setting={name}"] for peer in peers}
        if args.one_at_a_time:
            runs = {peer: _alone(script, child_args) for peer, child_args in children.items()}
        else:
            runs = run_children_in_lockstep(script, children, steps=args.steps + 1)  # + warm-up
        for peer, r in runs.items():
            if isinstance(r, RuntimeError):
                if peer != "trl-bf16":
                    raise r
                print(f"{name:<14} {peer:<12} did not run: {str(r).splitlines()[0]}")
                continue
            results[peer] = r
            print(
                f"{name:<14} {peer:<12} step {spread(r['step_times'])} s "
                f"(steps {', '.join(f'{t:.2f}' for t in r['step_times'])}), "
                f"peak RSS {r['rss_mib'] / 1024:.2f} GiB, mean completion "
                f"{r['mean_length']:.1f} tokens ({load_average()})",
                flush=True,
            )
        if "grpokit" in results:
            pairs += _setting_pairs(name, results)
    print_paired("training step ratios", pairs)


if __name__ == "__main__":
    main()
