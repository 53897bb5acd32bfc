"""``grpokit judge ...`` commands (wired into the main CLI as the ``judge`` group)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group(name="judge")
def judge_cli() -> None:
    """Inspect LLM-as-a-judge rewards."""


@judge_cli.command(name="audit")
@click.argument("config", type=click.Path(path_type=Path))
@click.option(
    "--completions",
    "completions",
    required=True,
    type=click.Path(path_type=Path),
    help='JSONL file, one {"prompt": ..., "completion": ..., <columns>} per line.',
)
@click.option(
    "--k",
    "k",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="How many times each completion is scored (the judge's noise).",
)
@click.option(
    "--reward",
    "reward_name",
    default=None,
    help="Name of the judge reward to audit when the config has several.",
)
@click.option(
    "--temperature",
    default=None,
    type=click.FloatRange(min=0.0),
    help="Override every judge's temperature (e.g. 0.7 to measure sampling noise).",
)
@click.option(
    "--no-planted",
    is_flag=True,
    default=False,
    help="Skip the planted bad answers (gibberish, empty, prompt copy, ...).",
)
@click.option(
    "--planted-prompts",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="For how many distinct prompts the planted answers are built.",
)
@click.option(
    "--seed", default=0, show_default=True, type=int, help="Seed for the planted gibberish."
)
@click.option(
    "--output",
    "output",
    default=None,
    type=click.Path(path_type=Path),
    help="Also write the full report as JSON to this file.",
)
def audit_command(
    config: Path,
    completions: Path,
    k: int,
    reward_name: str | None,
    temperature: float | None,
    no_planted: bool,
    planted_prompts: int,
    seed: int,
    output: Path | None,
) -> None:
    """Score COMPLETIONS k times with CONFIG's judge reward and report its noise, parse
    failures, ensemble agreement and how it scores planted bad answers."""
    from grpokit.rewards.judge.audit import print_report, run_audit

    report = run_audit(
        config,
        completions,
        k=k,
        reward_name=reward_name,
        temperature=temperature,
        planted=not no_planted,
        planted_prompts=planted_prompts,
        seed=seed,
    )
    print_report(report)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = output.with_name(f".{output.name}.tmp")
        tmp.write_text(report.to_json() + "\n", encoding="utf-8")
        tmp.replace(output)
        click.echo(f"report written to {output}")
