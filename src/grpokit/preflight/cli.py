"""The `grpokit preflight` and `grpokit theory` commands."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from grpokit.cli_options import (
    generations_option,
    out_option,
    overrides_option,
    prompt_count_option,
    seed_option,
)


@click.command("preflight")
@click.argument("config", type=click.Path(path_type=Path))
@prompt_count_option(8, "Training prompts to sample (drawn with the config's seed).")
@generations_option("Completions per prompt (default: training.num_generations).")
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    default=None,
    help="Measure this checkpoint (checkpoint-N of a run, or an SFT output) instead of "
    "the config's model.init_from, e.g. after training.",
)
@out_option(
    "Where to write the JSON: a directory (preflight.json inside) or a .json "
    "file. Default: the run directory (training.output_dir)."
)
@seed_option("Sampling seed (default: training.seed).", default=None)
@overrides_option("Override a config value, e.g. --set training.temperature=1.2 (repeatable).")
def preflight_cmd(
    config: Path,
    n_prompts: int,
    generations: int | None,
    checkpoint: Path | None,
    out: Path | None,
    seed: int | None,
    overrides: tuple[str, ...],
) -> None:
    """Will this run learn at all? Sample groups as training would, and say.

    Reports per reward the mean, the pass rate (share at the reward's maximum) with a 95%
    Wilson interval, the share of groups with equal rewards (no gradient), parse failures,
    gated-out shares, lengths and truncation; the success-amplification forecast; and a verdict
    with advice. Exit code 0: go (or low signal); 1: cold start (or saturated), i.e. no group
    would carry a learning signal. Writes preflight.json for `grpokit report`.
    """
    from grpokit.config import load_config
    from grpokit.preflight.run import run_preflight

    cfg = load_config(config, list(overrides))
    result = run_preflight(
        cfg,
        prompts=n_prompts,
        generations=generations,
        seed=seed,
        checkpoint=checkpoint,
        out=out,
    )
    sys.exit(result.verdict.exit_code)


@click.command("theory")
@click.option(
    "--p-ref",
    "p_ref",
    type=float,
    required=True,
    help="Success probability of the starting model (e.g. a preflight pass rate).",
)
@click.option("--beta", type=float, required=True, help="KL coefficient (training.beta), > 0.")
@click.option(
    "--eps",
    type=float,
    default=1e-6,
    show_default=True,
    help="Floor inside the std: sqrt(p(1-p) + eps).",
)
@click.option("--steps", type=int, default=10, show_default=True, help="Iterations to print.")
@click.option(
    "--png",
    type=click.Path(path_type=Path),
    default=Path("theory.png"),
    show_default=True,
    help="Where to draw h(p) with its fixed points.",
)
def theory_cmd(p_ref: float, beta: float, eps: float, steps: int, png: Path) -> None:
    """Success amplification: iterate p_{n+1} = h(p_n) from p_ref (docs/math.md, section 5).

    Prints the iteration table, every fixed point with its stability, the value without std
    normalisation, and draws h(p) with the diagonal, the fixed points and the iteration.
    """
    from grpokit.preflight.theory_plot import compute, plot, table_lines

    result = compute(p_ref, beta=beta, eps=eps, steps=steps)
    for line in table_lines(result):
        click.echo(line)
    click.echo(f"plot: {plot(result, png)}")
