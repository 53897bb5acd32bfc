"""``grpokit rewards ...``: commands about the configured rewards."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group(name="rewards")
def rewards_cli() -> None:
    """Inspect and test the rewards a config declares."""


@rewards_cli.command(name="check")
@click.argument("config", type=click.Path(path_type=Path))
@click.option(
    "--completions",
    "completions_path",
    required=True,
    type=click.Path(path_type=Path),
    help='JSONL file: one {"completion": ..., "prompt": ..., <columns>} object per line.',
)
@click.option("--width", default=60, show_default=True, help="Characters of each completion shown.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object per completion instead."
)
def check_cmd(config: Path, completions_path: Path, width: int, as_json: bool) -> None:
    """Score the completions in a JSONL file with CONFIG's rewards, before training with them.

    \b
    Example:
      grpokit rewards check config.yaml --completions samples.jsonl
    """
    from rich.console import Console

    from grpokit.config import load_reward_specs
    from grpokit.rewards.audit.check import check_completions, format_table, score_records

    specs, base_dir = load_reward_specs(config)
    result = check_completions(specs, completions_path, base_dir=base_dir)
    if as_json:
        for record in score_records(result.scores):
            click.echo(json.dumps(record, ensure_ascii=False))
    else:
        Console().print(format_table(result.scores, result.rows, max_chars=width))
    # Below the table, on stderr (so that --json output stays one JSON object per line).
    for warning in result.warnings:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
