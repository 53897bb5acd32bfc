"""``grpokit rewards ...``: commands about the configured rewards."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import click

from grpokit.errors import UserError

if TYPE_CHECKING:
    from grpokit.rewards.spec import RewardSpec


@click.group(name="rewards")
def rewards_cli() -> None:
    """Inspect and test the rewards a config declares."""


def _load_specs(config: Path) -> tuple[list[RewardSpec], Path]:
    """The reward specs and the directory relative paths resolve against.

    A full grpokit config is read with ``grpokit.config.load_config``; a YAML holding only a
    ``rewards:`` list is accepted too, to try rewards before the rest of the config exists.
    """
    import yaml

    from grpokit.rewards.audit.common import read_utf8
    from grpokit.rewards.spec import parse_reward_specs

    if not config.is_file():
        raise UserError(f"config file {config} does not exist")
    try:
        data = yaml.safe_load(read_utf8(config))
    except yaml.YAMLError as exc:
        raise UserError(f"{config}: not valid YAML: {exc}") from None
    if isinstance(data, dict) and set(data) == {"rewards"}:
        return parse_reward_specs(data["rewards"], source=str(config)), config.resolve().parent
    from grpokit.config import load_config

    cfg = load_config(config)
    return list(cfg.rewards), cfg.config_dir


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

    from grpokit.rewards.audit.check import check_completions, format_table

    specs, base_dir = _load_specs(config)
    result = check_completions(specs, completions_path, base_dir=base_dir)
    scores, rows = result.scores, result.rows
    if as_json:
        for i in range(len(rows)):
            record = {
                name: (None if math.isnan(v) else v)
                for name, v in zip(scores.names, scores.per_function[i].tolist(), strict=True)
            }
            gated = [
                n for n, g in zip(scores.names, scores.gated_out[i].tolist(), strict=True) if g
            ]
            total = scores.total[i].item()
            click.echo(
                json.dumps(
                    {
                        "row": i + 1,
                        "rewards": record,
                        "gated_out": gated,
                        "total": None if math.isnan(total) else total,
                    },
                    ensure_ascii=False,
                )
            )
    else:
        Console().print(format_table(scores, rows, max_chars=width))
    # Below the table, on stderr (so that --json output stays one JSON object per line).
    for warning in result.warnings:
        click.secho(f"warning: {warning}", fg="yellow", err=True)
