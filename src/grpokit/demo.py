"""`grpokit demo`: the whole workflow on the embedded model, on a laptop CPU, in about 10 minutes.

Task: two-digit addition answered as <thinking>...</thinking><answer>N</answer>. The base model
almost never produces that format (the cold start: every reward 0, nothing to learn from), so the
demo warm-starts it with a short SFT on generated demonstrations, then trains with GRPO from that
checkpoint (which also becomes the KL reference), and measures held-out pass rates at each stage.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from grpokit.config import EMBEDDED_MODEL, ModelConfig, load_config
from grpokit.core.stats import wilson_interval
from grpokit.data.prompts import PromptRow, load_prompts
from grpokit.data.tasks import ARITHMETIC_SYSTEM_PROMPT, write_arithmetic_task
from grpokit.rewards.compose import build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.sampling import PassSummary, Sampled, Sampler, sampling_params
from grpokit.train.sft import load_demonstrations, run_sft
from grpokit.train.trainer import GRPOTrainer

# Measured on a 2-core CPU (see README): a short SFT puts the format in place without collapsing
# the sampling entropy; GRPO then works on correctness.
SFT_STEPS = 16
GRPO_STEPS = 60
EVAL_SAMPLES = 2
HELDOUT_SEED = 1234


def demo_config(data_dir: Path, sft_dir: Path, *, steps: int) -> dict[str, Any]:
    return {
        "model": {
            "name_or_path": EMBEDDED_MODEL,
            "init_from": str(sft_dir),
            "lora": {"r": 16, "alpha": 32, "dropout": 0.0},
        },
        "data": {
            "train": str(data_dir / "train.jsonl"),
            "heldout": str(data_dir / "heldout.jsonl"),
            "system_prompt": ARITHMETIC_SYSTEM_PROMPT,
        },
        "rewards": [
            {"type": "xml_format", "name": "format", "tags": ["thinking", "answer"]},
            {
                "type": "math_answer",
                "name": "answer",
                "answer_column": "answer",
                "gate": {"reward": "format", "min": 1.0},
            },
        ],
        "training": {
            "learning_rate": 2e-4,
            "max_steps": steps,
            "num_generations": 8,
            "per_device_train_batch_size": 8,
            "gradient_accumulation_steps": 2,
            "max_completion_length": 64,
            "temperature": 1.0,
            "beta": 0.04,
            "loss_type": "dapo",
            "lr_scheduler_type": "constant",
            "seed": 0,
            "save_steps": 0,
            "report_to": ["tensorboard"],
        },
    }


def heldout_pass_rates(sampler: Sampler, rows: list[PromptRow], *, samples: int) -> Sampled:
    """Each held-out prompt answered ``samples`` times with a fixed seed, scored: the same draws
    for every stage, so the stages differ only by their weights."""
    return sampler.score_prompts(rows, samples, seed=HELDOUT_SEED)


def _cell(s: PassSummary) -> str:
    if s.passed is None:
        return f"{s.mean:.2f}"
    lo, hi = wilson_interval(s.passed, s.applicable)
    return f"{s.passed}/{s.applicable}  [{lo:.2f}, {hi:.2f}]"


def run_demo(output_dir: Path, *, steps: int | None = None, quick: bool = False) -> dict[str, Any]:
    console = Console()
    output_dir = output_dir.resolve()
    data_dir = output_dir / "data"
    sft_dir = output_dir / "sft"
    n_heldout = 8 if quick else 32
    sft_steps = 4 if quick else SFT_STEPS
    grpo_steps = steps if steps is not None else (2 if quick else GRPO_STEPS)
    paths = write_arithmetic_task(data_dir, n_heldout=n_heldout)
    cfg_path = output_dir / "grpo.yaml"
    cfg_path.write_text(
        yaml.safe_dump(demo_config(data_dir, sft_dir, steps=grpo_steps), sort_keys=False)
    )
    cfg = load_config(cfg_path)
    rewards = build_reward_set(cfg.rewards, BuildContext(base_dir=output_dir, run_dir=None, seed=0))
    heldout = load_prompts(paths["heldout"])
    console.rule("[bold]grpokit demo: two-digit addition with <thinking>/<answer> tags")
    console.print(f"files in {output_dir}; GRPO config {cfg_path}")

    t0 = time.perf_counter()
    # The base model, in full (SFT trains every weight), sampled as the GRPO run will sample.
    base = Sampler.load(
        ModelConfig(name_or_path=EMBEDDED_MODEL),
        rewards,
        sampling=sampling_params(cfg.training),
        system_prompt=cfg.system_prompt,
        max_prompt_length=cfg.training.max_prompt_length,
        base_dir=output_dir,
    )
    policy = base.policy
    results: dict[str, list[PassSummary]] = {}
    console.print(
        f"[bold]1/4[/] base model on {n_heldout} held-out problems x {EVAL_SAMPLES} samples"
    )
    results["base model"] = heldout_pass_rates(base, heldout, samples=EVAL_SAMPLES).summary()
    base_format = results["base model"][0]
    console.print(f"  format followed: {_cell(base_format)}")
    if not base_format.passed:
        console.print(
            "  [yellow]cold start[/]: the base model never follows the format, so every reward "
            "is 0 and GRPO has no signal. Warm-starting with a short SFT on generated "
            "demonstrations (grpokit sft does the same for your task)."
        )

    console.print(f"[bold]2/4[/] SFT warm-start: {sft_steps} steps on {paths['demos'].name}")
    history = run_sft(
        policy.model,
        policy.tokenizer,
        load_demonstrations(paths["demos"]),
        policy.trainable_parameters(),
        system_prompt=ARITHMETIC_SYSTEM_PROMPT,
        max_steps=sft_steps,
        batch_size=8,
        learning_rate=2e-5,
        log=lambda m: console.print("  " + m),
    )
    policy.save(sft_dir)
    results["after SFT"] = heldout_pass_rates(base, heldout, samples=EVAL_SAMPLES).summary()
    console.print(
        f"  format {_cell(results['after SFT'][0])}, answer {_cell(results['after SFT'][1])}, "
        f"entropy {history[-1]['entropy']:.2f} (kept above 0 so GRPO groups still differ)"
    )
    del policy, base

    console.print(f"[bold]3/4[/] GRPO: {grpo_steps} steps from the SFT checkpoint (LoRA)")
    trainer = GRPOTrainer(cfg, run_dir=output_dir / "grpo", progress=True, log=console.print)
    result = trainer.train()
    console.print("[bold]4/4[/] trained model on the same held-out problems and seeds")
    trained = replace(trainer.sampler, rewards=rewards)
    results["after GRPO"] = heldout_pass_rates(trained, heldout, samples=EVAL_SAMPLES).summary()

    table = Table(
        title=f"held-out pass rates ({n_heldout} problems x {EVAL_SAMPLES} samples, 95% CI)"
    )
    table.add_column("model")
    for s in results["base model"]:
        table.add_column(s.name)
    for name, summaries in results.items():
        table.add_row(name, *[_cell(s) for s in summaries])
    console.print(table)
    rewards_curve = [
        h["reward"] for h in result.history if not math.isnan(h.get("reward", math.nan))
    ]
    k = max(1, len(rewards_curve) // 4)
    early, late = sum(rewards_curve[:k]) / k, sum(rewards_curve[-k:]) / k
    console.print(
        f"training reward: first {k} steps {early:.3f} -> last {k} steps {late:.3f}; "
        f"curve in {result.run_dir / 'metrics.jsonl'}"
    )
    console.print(f"total time {time.perf_counter() - t0:.0f} s; checkpoint {result.checkpoint}")
    summary = {
        "stages": {name: [s.__dict__ for s in summaries] for name, summaries in results.items()},
        "reward_early": early,
        "reward_late": late,
        "run_dir": str(result.run_dir),
    }
    (output_dir / "demo_summary.json").write_text(json.dumps(summary, indent=2))
    rewards.close()
    return summary
