"""``grpokit judge ...`` commands (wired into the main CLI as the ``judge`` group)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from grpokit.cli_options import seed_option

if TYPE_CHECKING:
    from grpokit.rewards.audit.judge import AuditReport, ScoringComparison
    from grpokit.rewards.audit.reward_model import RewardModelAudit

_F = TypeVar("_F", bound=Callable[..., Any])


@click.group(name="judge")
def judge_cli() -> None:
    """Inspect LLM-as-a-judge rewards and trained reward models."""


def _audit_options(kind: str, *, k: int, k_help: str) -> Callable[[_F], _F]:
    """The options every audit takes; ``kind`` names the reward type in the help, ``k`` and
    ``k_help`` are the default and meaning of --k (how often each completion is scored)."""

    def decorate(command: _F) -> _F:
        for option in reversed(
            [
                click.argument("config", type=click.Path(path_type=Path)),
                click.option(
                    "--completions",
                    "completions",
                    required=True,
                    type=click.Path(path_type=Path),
                    help='JSONL file, one {"prompt": ..., "completion": ..., <columns>} per line.',
                ),
                click.option(
                    "--reward",
                    "reward_name",
                    default=None,
                    help=f"Name of the {kind} reward to audit when the config has several.",
                ),
                click.option(
                    "--no-planted",
                    is_flag=True,
                    default=False,
                    help="Skip the planted bad answers (gibberish, empty, prompt copy, ...).",
                ),
                click.option(
                    "--planted-prompts",
                    default=3,
                    show_default=True,
                    type=click.IntRange(min=1),
                    help="For how many distinct prompts the planted answers are built.",
                ),
                seed_option("Seed for the planted gibberish."),
                click.option(
                    "--output",
                    "output",
                    default=None,
                    type=click.Path(path_type=Path),
                    help="Also write the full report as JSON to this file.",
                ),
                click.option(
                    "--k",
                    "k",
                    default=k,
                    show_default=True,
                    type=click.IntRange(min=1),
                    help=k_help,
                ),
            ]
        ):
            command = option(command)
        return command

    return decorate


def _write_report(output: Path | None, text: str) -> None:
    """Write the JSON report through a temporary file, so a failure leaves no half file."""
    if output is None:
        return
    from grpokit.files import write_atomic

    write_atomic(output, text + "\n")
    click.echo(f"report written to {output}")


@judge_cli.command(name="audit")
@_audit_options(
    "judge", k=3, k_help="How many times each completion is scored (the judge's noise)."
)
@click.option(
    "--temperature",
    default=None,
    type=click.FloatRange(min=0.0),
    help="Override every judge's temperature (e.g. 0.7 to measure sampling noise).",
)
@click.option(
    "--compare-scoring",
    is_flag=True,
    default=False,
    help="Audit the reward twice, each completion judged alone (rubric) and each prompt's "
    "answers judged together (group_rubric), and print the two side by side.",
)
def audit_command(
    config: Path,
    completions: Path,
    k: int,
    reward_name: str | None,
    temperature: float | None,
    compare_scoring: bool,
    no_planted: bool,
    planted_prompts: int,
    seed: int,
    output: Path | None,
) -> None:
    """Score COMPLETIONS k times with CONFIG's judge reward and report its noise, parse
    failures, ensemble agreement and how it scores planted bad answers."""
    from grpokit.rewards.audit.judge import print_comparison, print_report

    options: dict[str, Any] = {
        "k": k,
        "reward_name": reward_name,
        "temperature": temperature,
        "planted": not no_planted,
        "planted_prompts": planted_prompts,
        "seed": seed,
    }
    if compare_scoring:
        comparison = run_scoring_comparison(config, completions, **options)
        print_report(comparison.absolute)
        print_report(comparison.group)
        print_comparison(comparison)
        _write_report(output, comparison.to_json())
        return
    report = run_audit(config, completions, **options)
    print_report(report)
    _write_report(output, report.to_json())


@judge_cli.command(name="audit-reward-model")
@_audit_options(
    "reward_model",
    k=2,
    k_help="How many times each completion is scored, each time in other batches (the noise).",
)
def audit_reward_model_command(
    config: Path,
    completions: Path,
    k: int,
    reward_name: str | None,
    no_planted: bool,
    planted_prompts: int,
    seed: int,
    output: Path | None,
) -> None:
    """Score COMPLETIONS with CONFIG's reward_model reward and report its noise, how it scores
    planted bad answers, and how its score correlates with completion length."""
    from grpokit.rewards.audit.reward_model import print_reward_model_audit

    report = run_reward_model_audit(
        config,
        completions,
        k=k,
        reward_name=reward_name,
        planted=not no_planted,
        planted_prompts=planted_prompts,
        seed=seed,
    )
    print_reward_model_audit(report)
    _write_report(output, report.to_json())


@judge_cli.command(name="audit-checklist")
@click.argument("config", type=click.Path(path_type=Path))
@click.option(
    "--completions",
    "completions",
    required=True,
    type=click.Path(path_type=Path),
    help='Labelled JSONL, one {"prompt": ..., "completion": ..., "fails": [items]} per line: '
    "the items the answer does not meet (empty for a good answer).",
)
@click.option(
    "--reward",
    "reward_name",
    default=None,
    help="Name of the checklist reward to audit when the config has several.",
)
@click.option(
    "--output",
    "output",
    default=None,
    type=click.Path(path_type=Path),
    help="Also write the full report as JSON to this file.",
)
def audit_checklist_command(
    config: Path, completions: Path, reward_name: str | None, output: Path | None
) -> None:
    """Score labelled COMPLETIONS with CONFIG's checklist and report, per item, whether its
    check (a judge's yes/no question or a program) tells the answers that meet it from those
    that do not better than chance."""
    from grpokit.config import load_config
    from grpokit.rewards.audit.checklist import audit_checklist, print_checklist_audit

    cfg = load_config(config)
    report = audit_checklist(
        cfg.rewards, cfg.config_dir, completions, source=str(config), reward_name=reward_name
    )
    print_checklist_audit(report)
    _write_report(output, report.to_json())


def run_audit(config: Path, completions: Path, **options: Any) -> AuditReport:
    """``grpokit judge audit``: the config's judge reward audited on a completions file."""
    from grpokit.config import load_config
    from grpokit.rewards.audit.judge import audit_judge

    cfg = load_config(config)
    (report,) = audit_judge(cfg.rewards, cfg.config_dir, completions, source=str(config), **options)
    return report


def run_scoring_comparison(config: Path, completions: Path, **options: Any) -> ScoringComparison:
    """``grpokit judge audit --compare-scoring``: absolute against group scoring."""
    from grpokit.config import load_config
    from grpokit.rewards.audit.judge import compare_scoring

    cfg = load_config(config)
    return compare_scoring(cfg.rewards, cfg.config_dir, completions, source=str(config), **options)


def run_reward_model_audit(config: Path, completions: Path, **options: Any) -> RewardModelAudit:
    """``grpokit judge audit-reward-model``: the config's reward model audited likewise."""
    from grpokit.config import load_config
    from grpokit.rewards.audit.reward_model import audit_reward_model_config

    cfg = load_config(config)
    return audit_reward_model_config(
        cfg.rewards, cfg.config_dir, completions, source=str(config), **options
    )


@judge_cli.command(name="pairwise")
@click.argument("eval_dir", type=click.Path(path_type=Path))
@click.option(
    "--config",
    "config",
    required=True,
    type=click.Path(path_type=Path),
    help="The config whose judge asks (the first judge of its judge or checklist reward).",
)
@click.option("--model", "x", required=True, help="The eval's label of the model under test.")
@click.option("--against", "y", required=True, help="The eval's label of the other (the base).")
@click.option(
    "--rubric-file",
    "rubric_file",
    required=True,
    type=click.Path(path_type=Path),
    help="The question, with {prompt}, {a} and {b}, asking for the letter A or B.",
)
@click.option(
    "--reward",
    "reward_name",
    default=None,
    help="The reward whose judge to use, when several have judges.",
)
@click.option(
    "--samples",
    "max_samples",
    default=None,
    type=click.IntRange(min=1),
    help="Use the first N samples of each prompt (default: all the eval drew).",
)
@click.option(
    "--output",
    "output",
    default=None,
    type=click.Path(path_type=Path),
    help="Directory for pairwise.json and pairwise_replies.jsonl (default: EVAL_DIR).",
)
def pairwise_command(
    eval_dir: Path,
    config: Path,
    x: str,
    y: str,
    rubric_file: Path,
    reward_name: str | None,
    max_samples: int | None,
    output: Path | None,
) -> None:
    """Which of two models answers better? Pair sample k of --model with sample k of --against
    on each prompt of EVAL_DIR (a `grpokit eval` output), ask the judge in both orders, and
    report the win rate with its interval over prompts, at equal length, and the position
    bias."""
    from grpokit.config import load_config
    from grpokit.errors import UserError
    from grpokit.evaluate.pairwise import compare_pairwise, pair_keys, read_eval_samples
    from grpokit.files import write_atomic
    from grpokit.rewards.judge.reward import build_backend
    from grpokit.rewards.judge.rubric import load_rubric

    cfg = load_config(config)
    rubric = load_rubric(None, str(rubric_file), Path.cwd(), "--rubric-file", placeholder="a")
    if "b" not in rubric.placeholders:
        raise UserError(f"{rubric.source}: the rubric has {{a}} but no {{b}} placeholder")
    samples = read_eval_samples(eval_dir)
    keys = pair_keys(samples, x, y, max_samples)
    with_judges = [s for s in cfg.rewards if getattr(s.params, "judges", None)]
    if reward_name is not None:
        with_judges = [s for s in with_judges if s.display_name == reward_name]
    if not with_judges:
        raise UserError(
            f"{config}: no reward {'named ' + repr(reward_name) + ' ' if reward_name else ''}"
            "has judges: (a judge or checklist reward) to ask"
        )
    spec = with_judges[0]
    judge = spec.params.judges[0]  # type: ignore[attr-defined]
    backend = build_backend(judge, f"reward {spec.display_name!r}.judges[0]", cfg.config_dir)
    try:
        report, records = compare_pairwise(samples, x, y, backend, rubric, keys)
    finally:
        backend.close()
    click.echo(report.summary())
    out = output if output is not None else eval_dir
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "pairwise.json", report.to_json() + "\n")
    write_atomic(
        out / "pairwise_replies.jsonl",
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
    )
    click.echo(f"written: {out / 'pairwise.json'}, {out / 'pairwise_replies.jsonl'}")
