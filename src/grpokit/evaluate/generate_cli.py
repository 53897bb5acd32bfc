"""The ``grpokit generate`` command; the top-level ``grpokit`` group adds it."""

from __future__ import annotations

from pathlib import Path

import click

from grpokit.cli_options import (
    config_option,
    device_option,
    models_option,
    out_option,
    seed_option,
)


@click.command("generate")
@models_option(
    "[LABEL=]MODEL: the embedded model's name, a model directory, a checkpoint-N/ or a run "
    "directory (latest checkpoint). Repeat it to compare models side by side."
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
@config_option(
    "A grpokit config: its rewards score the samples (not --prompt texts where a reward reads "
    "a column), and its system prompt and sampling settings are used (unless given below)."
)
@seed_option("Sampling seed (all models).")
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
@out_option("Also write every sample to this JSONL file.")
@device_option("cpu, cuda:0, ...; default: the config's, else auto.")
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

    from grpokit.evaluate.generate import render, run_generate, write_jsonl

    result = run_generate(
        models,
        prompts_file,
        texts,
        samples=samples,
        config=config,
        seed=seed,
        overrides={
            "max_completion_length": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
        },
        system_prompt=system_prompt,
        device=device,
        log=lambda msg: click.echo(msg, err=True),
    )
    render(result, Console())
    if out is not None:
        click.echo(f"samples: {write_jsonl(result, out)}")
