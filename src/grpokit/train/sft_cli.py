"""The ``grpokit sft`` command; the work is :mod:`grpokit.train.sft_run`."""

from __future__ import annotations

from pathlib import Path

import click

from grpokit.cli_options import (
    generations_option,
    overrides_option,
    prompt_count_option,
    seed_option,
)
from grpokit.train.sft_defaults import DEFAULT_LR_FULL, DEFAULT_LR_LORA, DEFAULT_STEPS


@click.command("sft")
@click.argument("config", type=click.Path(path_type=Path))
@click.option(
    "--data",
    type=click.Path(path_type=Path),
    default=None,
    help="Demonstrations: JSONL rows with 'prompt' and 'completion'.",
)
@click.option(
    "--from-rollouts",
    is_flag=True,
    help="Fine-tune on the model's own samples that pass (rejection sampling).",
)
@click.option(
    "--reward",
    default=None,
    help="--from-rollouts: the reward that decides a pass (default: every reward with a "
    "maximum must be at it).",
)
@click.option(
    "--threshold",
    type=float,
    default=None,
    help="--from-rollouts: minimum of --reward (default: its maximum), or of the total "
    "reward when --reward is not given.",
)
@prompt_count_option(32, "--from-rollouts: training prompts to sample.")
@generations_option("--from-rollouts: samples per prompt (default: training.num_generations).")
@click.option(
    "--min-kept",
    type=int,
    default=4,
    show_default=True,
    help="--from-rollouts: fail unless at least this many distinct samples pass.",
)
@click.option(
    "--steps",
    type=int,
    default=DEFAULT_STEPS,
    show_default=True,
    help="Optimizer steps. Few on purpose: a long SFT makes sampling deterministic and "
    "GRPO groups equal.",
)
@click.option("--batch-size", type=int, default=8, show_default=True, help="Pairs per step.")
@click.option(
    "--learning-rate",
    type=float,
    default=None,
    help=f"Default {DEFAULT_LR_FULL:g} full, {DEFAULT_LR_LORA:g} LoRA.",
)
@click.option(
    "--full/--lora",
    "full",
    default=None,
    help="Full fine-tuning or LoRA (default: LoRA if the config has model.lora).",
)
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Checkpoint directory (default: <run dir>/sft).",
)
@seed_option("Seed (default: training.seed).", default=None)
@overrides_option("Override a config value (repeatable).")
def sft_cmd(
    config: Path,
    data: Path | None,
    from_rollouts: bool,
    reward: str | None,
    threshold: float | None,
    n_prompts: int,
    generations: int | None,
    min_kept: int,
    steps: int,
    batch_size: int,
    learning_rate: float | None,
    full: bool | None,
    output: Path | None,
    seed: int | None,
    overrides: tuple[str, ...],
) -> None:
    """Supervised warm-start for a model that never produces what the rewards check.

    Loss on completion tokens only. The checkpoint is what `train` starts from with
    `model.init_from` (it also becomes the KL reference).
    """
    from grpokit.config import load_config
    from grpokit.train.run_lock import output_lock
    from grpokit.train.sft_run import Criterion, run_sft_from_config

    cfg = load_config(config, list(overrides))
    out = output if output is not None else cfg.output_dir / "sft"
    with output_lock(out.resolve()):  # one writer: a second sft into `out` is refused
        result = run_sft_from_config(
            cfg,
            output=out,
            data=data,
            from_rollouts=from_rollouts,
            criterion=Criterion(reward, threshold),
            prompts=n_prompts,
            generations=generations,
            min_kept=min_kept,
            steps=steps,
            batch_size=batch_size,
            learning_rate=learning_rate,
            lora=None if full is None else not full,
            seed=seed,
            log=click.echo,
        )
    click.echo(f"checkpoint: {result.output}")
    click.echo(
        f"next: grpokit preflight {config} --checkpoint {result.output}\n"
        f"      grpokit train {config} --set model.init_from={result.output.resolve()}"
    )
