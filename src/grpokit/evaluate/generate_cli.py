"""The ``grpokit generate`` command; the top-level ``grpokit`` group adds it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click


@click.command("generate")
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    help="[LABEL=]MODEL: the embedded model's name, a model directory, a checkpoint-N/ or a run "
    "directory (latest checkpoint). Repeat it to compare models side by side.",
)
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(path_type=Path),
    default=None,
    help="A prompt file (.jsonl / .csv / datasets directory), as in the config's data section.",
)
@click.option("--prompt", "texts", multiple=True, help="A prompt text (repeatable).")
@click.option("--samples", type=int, default=2, show_default=True, help="Samples per prompt (K).")
@click.option(
    "--config",
    type=click.Path(path_type=Path),
    default=None,
    help="A grpokit config: its rewards score the samples, and its system prompt and sampling "
    "settings are used (unless given below).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed (all models).")
@click.option("--temperature", type=float, default=None, help="Default: the config's, else 1.0.")
@click.option("--top-p", type=float, default=None, help="Default: the config's, else 1.0.")
@click.option("--top-k", type=int, default=None, help="Default: the config's, else 0 (off).")
@click.option(
    "--max-new-tokens",
    type=int,
    default=None,
    help="Default: the config's max_completion_length, else 128.",
)
@click.option("--system-prompt", default=None, help="Default: the config's system prompt.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write every sample to this JSONL file.",
)
@click.option("--device", default=None, help="cpu, cuda:0, ...; default: the config's, else auto.")
def generate_cmd(
    models: tuple[str, ...],
    prompts_file: Path | None,
    texts: tuple[str, ...],
    samples: int,
    config: Path | None,
    seed: int,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    max_new_tokens: int | None,
    system_prompt: str | None,
    out: Path | None,
    device: str | None,
) -> None:
    """Sample several models side by side with the same seeds and sampling settings, scored by
    the config's rewards when --config is given.

    \b
    Example (the base model against the trained one):
      grpokit generate --model base=smollm2-135m-instruct --model trained=runs/demo/grpo \\
          --prompts runs/demo/data/heldout.jsonl --config runs/demo/grpo.yaml --samples 2
    """
    from rich.console import Console

    from grpokit.config import ModelConfig
    from grpokit.errors import UserError
    from grpokit.evaluate.generate import generate_samples, prompt_rows, render, write_jsonl
    from grpokit.rewards.compose import RewardSet
    from grpokit.rollout.base import SamplingParams

    reward_set: RewardSet | None = None
    prompt_column, config_device = "prompt", "auto"
    max_prompt_length: int | None = None
    model_config: ModelConfig | None = None
    # The config's sampling settings when given, else plain sampling; options override both.
    defaults = SamplingParams(max_completion_length=128)
    if config is not None:
        from grpokit.config import load_config
        from grpokit.rewards.compose import build_reward_set
        from grpokit.rewards.registry import BuildContext
        from grpokit.sampling import sampling_params

        cfg = load_config(config)
        defaults = sampling_params(cfg.training)
        system_prompt = system_prompt if system_prompt is not None else cfg.system_prompt
        prompt_column, max_prompt_length = cfg.data.prompt_column, cfg.training.max_prompt_length
        config_device, model_config = cfg.model.device, cfg.model
        reward_set = build_reward_set(
            cfg.rewards, BuildContext(base_dir=cfg.config_dir, run_dir=None, seed=seed)
        )
    overrides: dict[str, Any] = {
        "max_completion_length": max_new_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
    }
    try:
        sampling = replace(defaults, **{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:
        raise UserError(f"sampling settings: {exc}") from exc
    try:
        rows = prompt_rows(prompts_file, texts, prompt_column=prompt_column)
        result = generate_samples(
            models,
            rows,
            samples=samples,
            sampling=sampling,
            seed=seed,
            system_prompt=system_prompt,
            max_prompt_length=max_prompt_length,
            reward_set=reward_set,
            device=device or config_device,
            model_config=model_config,
            log=lambda msg: click.echo(msg, err=True),
        )
    finally:
        if reward_set is not None:
            reward_set.close()
    render(result, Console())
    if out is not None:
        click.echo(f"samples: {write_jsonl(result, out)}")
