"""The `grpokit` command. Heavy imports happen inside commands, and the commands of COMMANDS are
imported only when used, so `--help` stays instant."""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

import click

from grpokit.cli_options import overrides_option, seed_option
from grpokit.errors import RunFailed, RunStopped, UserError

if TYPE_CHECKING:
    from grpokit.config import GRPOKitConfig
    from grpokit.sampling import Sampler, ScoredBatch

# peft still calls transformers' renamed gradient-checkpointing helpers; the warning is theirs to
# fix and says nothing to a grpokit user.
warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)


class _Group(click.Group):
    """Turns user errors into one message and exit code 2, and Ctrl-C into exit code 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as e:
            click.secho(f"error: {e}", fg="red", err=True)
            sys.exit(2)
        except RunFailed as e:
            if _debug():
                traceback.print_exception(e.__cause__ or e)
            click.secho(f"error: {e}", fg="red", err=True)
            sys.exit(1)
        except RunStopped as e:
            click.secho(str(e), fg="yellow", err=True)
            sys.exit(128 + e.signal_number)
        except KeyboardInterrupt as e:
            click.secho(str(e) or "interrupted", fg="yellow", err=True)
            sys.exit(130)


def _build_report(run_dir: Path) -> Path:
    """The report builder `train` hands the trainer, imported when a report is first written:
    a run whose config or data fails its checks never pays for importing the plotting."""
    from grpokit.evaluate.report import build_report

    return build_report(run_dir)


def _advice_on_steps(cfg: GRPOKitConfig, sampler: Sampler, batches: list[ScoredBatch]) -> list[str]:
    """preflight's advice for steps without a learning signal, imported when first needed."""
    from grpokit.preflight.run import advice_on_steps

    return advice_on_steps(cfg, sampler, batches)


def _debug() -> bool:
    """--debug or GRPOKIT_DEBUG=1: show the traceback behind a failed run's message."""
    return os.environ.get("GRPOKIT_DEBUG", "") not in ("", "0")


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:  # in the environment, so that processes a launcher starts see it too
        os.environ["GRPOKIT_DEBUG"] = "1"


_debug_option = click.option(
    "--debug",
    is_flag=True,
    expose_value=False,
    callback=_set_debug,
    help="Show the full traceback when a run fails (also: GRPOKIT_DEBUG=1).",
)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="grpokit")
@_debug_option
def main() -> None:
    """Post-train a language model with GRPO from one YAML config.

    \b
    Typical session:
      grpokit demo                         # the built-in arithmetic task, on CPU
      grpokit preflight config.yaml        # will this run learn at all?
      grpokit train config.yaml            # train; metrics in runs/<name>/
      grpokit eval --model BASE --model runs/<name>/checkpoint-N ...
      grpokit report runs/<name>           # one HTML page with every curve
    """


def _print_config_help(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from grpokit.config_docs import help_text

    click.echo(help_text())
    ctx.exit()


@main.command()
@click.argument("config", type=click.Path(path_type=Path))
@overrides_option(
    "Override a config value, e.g. --set training.beta=0.04 (repeatable). With a run "
    "directory: change what may change mid-run, e.g. --set training.max_steps=200."
)
@click.option("--output-dir", type=click.Path(path_type=Path), help="Run directory.")
@click.option(
    "--no-progress", is_flag=True, help="No live progress bar: a line per step (for logs and CI)."
)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=None,
    help="Data-parallel processes on this machine (runs torchrun; the same as "
    "`torchrun --nproc-per-node N -m grpokit train ...`).",
)
@click.option(
    "--nnodes",
    type=click.IntRange(min=1),
    default=None,
    help="Machines in the run: start the same command on each, with its own --node-rank and "
    "the same --master-addr (runs torchrun's static rendezvous; --nproc processes on each, "
    "default 1). The run directory must be on a filesystem every machine sees.",
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="This machine's number, 0 to --nnodes - 1; machine 0 holds rank 0, which writes the run.",
)
@click.option(
    "--master-addr",
    default=None,
    help="With --nnodes: the address of machine 0, reachable from every machine.",
)
@click.option(
    "--master-port",
    type=click.IntRange(min=1, max=65535),
    default=29500,  # torchrun's default (the CLI imports no torch before it runs)
    show_default=True,
    help="With --nnodes: a free port on machine 0 for the rendezvous.",
)
@click.option(
    "--help-config",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_config_help,
    help="Show every config field (training: by group: generation, loss, optimisation, "
    "checkpointing, logging, distribution) and exit. TRL's GRPOConfig fields: docs/trl.md.",
)
@_debug_option
def train(
    config: Path,
    overrides: tuple[str, ...],
    output_dir: Path | None,
    no_progress: bool,
    nproc: int | None,
    nnodes: int | None,
    node_rank: int,
    master_addr: str | None,
    master_port: int,
) -> None:
    """Train with GRPO. CONFIG is a YAML file, or a run directory to resume.

    Passing a run directory (one holding config.yaml and checkpoint-N/) resumes it from its
    latest checkpoint with the same data order, optimizer state and random state. --set may
    extend it (training.max_steps) or change what does not touch the checkpoint's state
    (checkpointing, logging, sampling, held-out eval, device); the changes are recorded with
    their step in RUN_DIR/config_changes.jsonl.
    """
    if config.is_dir() and output_dir is not None:
        raise UserError(
            f"--output-dir: {config} is a run directory, which resumes in place. To train on "
            f"from it in a new directory: grpokit train CONFIG --set model.init_from="
            f"{config}/checkpoint-N --output-dir {output_dir}"
        )
    if nnodes is None and (master_addr is not None or node_rank or master_port != 29500):
        raise UserError(
            "--node-rank, --master-addr and --master-port go with --nnodes (the number of machines)"
        )
    if nproc is not None or nnodes is not None:
        from grpokit.train.distributed import Nodes, launch

        args = ["train", str(config), *(f"--set={o}" for o in overrides), "--no-progress"]
        if output_dir is not None:
            args += ["--output-dir", str(output_dir)]
        nodes = Nodes(nnodes or 1, node_rank, master_addr, master_port)
        sys.exit(launch(nproc or 1, args, nodes))

    from grpokit.train.run import resume_run, train_from_config

    if config.is_dir():
        result = resume_run(
            config,
            list(overrides),
            progress=not no_progress,
            build_report=_build_report,
            advise=_advice_on_steps,
        )
    else:
        result = train_from_config(
            config,
            list(overrides),
            output_dir=output_dir,
            progress=not no_progress,
            build_report=_build_report,
            advise=_advice_on_steps,
        )
    click.echo(f"done: {result.global_step} steps; checkpoint {result.checkpoint}")
    click.echo(f"metrics: {result.run_dir / 'metrics.jsonl'}")


@main.command()
@click.option(
    "--output-dir",
    type=click.Path(path_type=Path),
    default=Path("runs/demo"),
    show_default=True,
    help="Where the demo writes its runs.",
)
@click.option("--steps", type=int, default=None, help="GRPO steps (default: the demo's own).")
@click.option("--quick", is_flag=True, help="A much shorter run, for smoke tests.")
@click.option(
    "--tools",
    "with_tools",
    is_flag=True,
    help="The tool-arithmetic recipe instead: three-digit by two-digit products with a "
    "calculator tool, measured with the tool and without it (docs/demo.md).",
)
@click.option(
    "--long",
    "long_run",
    is_flag=True,
    help="A longer SFT and twice the GRPO steps, in float32: about 93% correct on the 200 fresh "
    "problems instead of about 88%, for about 30 CPU-minutes instead of 13 (docs/demo.md).",
)
@click.option(
    "--model",
    default=None,
    metavar="NAME",
    help="Train this model instead of the embedded one: a named model (grpokit models), a model "
    "folder or a GGUF file. No SFT: GRPO starts from the model, which must already follow the "
    "format sometimes (qwen2.5-coder-0.5b-instruct: 3 answers in 4; docs/demo.md).",
)
@seed_option("Seeds the SFT's order and GRPO's sampling; the problems stay the same.")
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32"]),
    default=None,
    help="model.dtype of both stages (default: the demo's own). 'auto' computes in bfloat16 "
    "where the CPU multiplies it natively (AVX512-BF16 or AMX), float32 elsewhere.",
)
def demo(
    output_dir: Path,
    steps: int | None,
    quick: bool,
    with_tools: bool,
    long_run: bool,
    model: str | None,
    seed: int,
    dtype: Literal["auto", "float32"] | None,
) -> None:
    """Train the embedded model on two-digit addition with <answer> tags, on CPU.

    Measures the base model on held-out problems, warm-starts it with a short SFT on generated
    demonstrations (the base model never follows the format: the cold start), trains with GRPO
    and measures again, on 200 fresh problems. About 10 minutes on an idle 2-core CPU.
    """
    from dataclasses import replace

    from grpokit.demo import TOOL_DEMO, TOOL_QUICK, run_demo, run_tool_demo, settings_for

    if quick and long_run:
        raise UserError("grpokit demo: choose --quick or --long, not both")
    if with_tools:
        if long_run or dtype is not None or model is not None:
            raise UserError(
                "grpokit demo --tools: --long, --model and --dtype apply to the addition demo"
            )
        tool_settings = replace(TOOL_QUICK if quick else TOOL_DEMO, seed=seed)
        if steps is not None:
            tool_settings = replace(tool_settings, grpo_steps=steps)
        run_tool_demo(output_dir, tool_settings)
        return
    settings = replace(settings_for(model, quick=quick, long_run=long_run), seed=seed)
    if steps is not None:
        settings = replace(settings, grpo_steps=steps)
    if dtype is not None:
        settings = replace(settings, dtype=dtype)
    run_demo(output_dir, settings)


class Listed(NamedTuple):
    """A command that lives with its feature: where it is, and what `grpokit --help` says of it."""

    module: str
    attr: str
    name: str
    summary: str
    """The first sentence of the command's help, which click shortens to fit the terminal."""


COMMANDS: tuple[Listed, ...] = (
    Listed(
        "grpokit.rewards.cli",
        "rewards_cli",
        "rewards",
        "Inspect and test the rewards a config declares.",
    ),
    Listed(
        "grpokit.rewards.judge.cli",
        "judge_cli",
        "judge",
        "Inspect LLM-as-a-judge rewards and trained reward models.",
    ),
    Listed(
        "grpokit.evaluate.cli",
        "report_cmd",
        "report",
        "One self-contained HTML report of a run (plots also as PNG in RUN_DIR/report/).",
    ),
    Listed(
        "grpokit.evaluate.cli",
        "compare_cmd",
        "compare",
        "Overlay the key curves of several runs and list how their configs differ.",
    ),
    Listed(
        "grpokit.evaluate.cli",
        "eval_cmd",
        "eval",
        "Compare models (the base first) on held-out prompts: per-prompt table, pass rates with "
        "95% intervals, pass@k, lengths and a paired comparison.",
    ),
    Listed(
        "grpokit.preflight.cli",
        "preflight_cmd",
        "preflight",
        "Will this run learn at all? Sample groups as training would, and say.",
    ),
    Listed(
        "grpokit.preflight.cli",
        "theory_cmd",
        "theory",
        "Success amplification: iterate p_{n+1} = h(p_n) from p_ref (docs/math.md, section 5).",
    ),
    Listed(
        "grpokit.train.sft_cli",
        "sft_cmd",
        "sft",
        "Supervised warm-start for a model that never produces what the rewards check.",
    ),
    Listed(
        "grpokit.models.cli",
        "export_cmd",
        "export",
        "Export CHECKPOINT (a checkpoint-N/, a run directory for its latest checkpoint (its best "
        "with --best or training.load_best_model_at_end), or a model directory) for use outside "
        "grpokit.",
    ),
    Listed(
        "grpokit.models.cli",
        "models_cmd",
        "models",
        "The named offline models: which are installed and converted, and what each costs.",
    ),
    Listed(
        "grpokit.evaluate.generate_cli",
        "generate_cmd",
        "generate",
        "Sample several models side by side with the same seeds and sampling settings, scored by "
        "the config's rewards when --config is given.",
    ),
    Listed(
        "grpokit.evaluate.review_cli",
        "review_cmd",
        "review",
        "Grade samples by hand, blind, on a local web page; compare the grades with the judges.",
    ),
    Listed(
        "grpokit.recipes.cli",
        "recipes_cli",
        "recipes",
        "Ready configs shipped with grpokit: list them, or copy one into a directory to edit.",
    ),
    Listed(
        "grpokit.rollout.cli",
        "vllm_serve_cmd",
        "vllm-serve",
        "Serve a model with vLLM for `vllm_mode: server` without NCCL (weights pushed as files).",
    ),
)
"""The commands that live with their feature. Their modules import torch, transformers or
matplotlib, which takes seconds, so `main` lists them from this table and imports a module only
when its command is used; tests/test_cli.py checks the table against the commands."""


def _load(module: str, attr: str) -> click.Command:
    """The command ``attr`` of ``module``. All of them ship with grpokit, so a module or attribute
    that is missing (a renamed command) is an error, not a command that quietly vanishes."""
    import importlib

    command = getattr(importlib.import_module(module), attr, None)
    if not isinstance(command, click.Command):
        raise ImportError(f"{module} has no click command {attr!r} (listed in grpokit.cli)")
    return command


def register_commands(group: click.Group, commands: Iterable[tuple[str, ...]] = COMMANDS) -> None:
    """Add each command of ``commands`` (module and attribute first) itself to ``group``,
    importing its module now: what checks the table, where `main` holds stand-ins."""
    for module, attr, *_ in commands:
        group.add_command(_load(module, attr))


class _ListedCommand:
    """Stands in `main` for a command of COMMANDS. `grpokit --help` asks only its name, whether
    it is hidden and its short help, answered from the table; any other question (running it,
    its own --help, its params) imports its module and is answered by the command itself."""

    def __init__(self, listed: Listed) -> None:
        self.listed = listed
        self.name = listed.name
        self.hidden = False
        self._command: click.Command | None = None
        # A command of the summary alone shortens it exactly as the real one shortens its help.
        self.get_short_help_str = click.Command(listed.name, help=listed.summary).get_short_help_str

    def __getattr__(self, attr: str) -> Any:
        if self._command is None:
            self._command = _load(self.listed.module, self.listed.attr)
        return getattr(self._command, attr)


for _listed in COMMANDS:
    # Not a click.Command, but it answers every question as the command does.
    main.add_command(cast(click.Command, _ListedCommand(_listed)))


if __name__ == "__main__":
    main()
