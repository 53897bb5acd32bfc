"""Click commands of this package; the top-level ``grpokit`` group adds them."""

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


@click.command("report")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--eval",
    "eval_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Directory written by `grpokit eval` (its eval.json becomes the eval section).",
)
@out_option("HTML file to write; default RUN_DIR/report/report.html.")
def report_cmd(run_dir: Path, eval_dir: Path | None, out: Path | None) -> None:
    """One self-contained HTML report of a run (plots also as PNG in RUN_DIR/report/)."""
    from grpokit.evaluate.report import build_report

    path = build_report(run_dir, eval_dir=eval_dir, out=out)
    click.echo(f"report: {path}")


@click.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@out_option(
    "HTML file to write; the PNGs go to <name>_plots/ beside it.", default=Path("compare.html")
)
def compare_cmd(run_dirs: tuple[Path, ...], out: Path) -> None:
    """Overlay the key curves of several runs and list how their configs differ."""
    from grpokit.evaluate.compare import compare_runs

    path = compare_runs(list(run_dirs), out)
    click.echo(f"compare: {path}")


@click.command("eval")
@models_option(
    "[LABEL=]MODEL: the embedded model's name, a model directory, a checkpoint-N/ or a run "
    "directory (latest checkpoint). Repeat it; the first is the base the others are compared with."
)
@click.option(
    "--prompts",
    type=click.Path(path_type=Path),
    required=True,
    help="Held-out prompts, never trained on: a file or folder `datasets` reads (.jsonl, .json, "
    ".csv, .parquet, .arrow, a save_to_disk folder).",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Samples per prompt (K).",
)
@config_option(
    "Config whose rewards score the samples and whose training section sets the sampling; "
    "default: the config.yaml of a --model run directory."
)
@out_option(
    "Output directory (eval.json, completions.jsonl, eval.md); default runs/eval-<prompts>.",
    dest="out_dir",
)
@seed_option("Sampling seed (all models).")
@click.option(
    "--max-prompts", type=click.IntRange(min=1), default=None, help="Use only the first N prompts."
)
@click.option(
    "--pass",
    "thresholds",
    multiple=True,
    metavar="REWARD=VALUE",
    help="Pass threshold of a reward (default: its maximum, when it has one). Repeatable.",
)
@click.option(
    "--among",
    multiple=True,
    metavar="REWARD",
    help="Also compare every other reward over the samples that pass REWARD's threshold only, "
    "e.g. --among xml_format: the judged score of the formatted answers alone. Repeatable.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Completions sampled at once.",
)
@device_option("cpu, cuda, cuda:N or mps; default: the config's model.device.")
def eval_cmd(
    models: tuple[str, ...],
    prompts: Path,
    samples: int,
    config: Path | None,
    out_dir: Path | None,
    seed: int,
    max_prompts: int | None,
    thresholds: tuple[str, ...],
    among: tuple[str, ...],
    batch_size: int,
    device: str | None,
) -> None:
    """Compare models (the base first) on held-out prompts: per-prompt table, pass rates with
    95% intervals, pass@k, lengths and a paired comparison. Markdown here; JSON and the raw
    completions in the output directory."""
    from grpokit.evaluate.eval import render_markdown, run_eval

    out = out_dir or Path("runs") / f"eval-{prompts.stem}"
    result = run_eval(
        list(models),
        prompts,
        samples=samples,
        out_dir=out,
        config=config,
        seed=seed,
        max_prompts=max_prompts,
        thresholds=thresholds,
        among=among,
        batch_size=batch_size,
        device=device,
        log=lambda msg: click.echo(msg, err=True),
    )
    click.echo(render_markdown(result))
    click.echo(f"eval: {out / 'eval.json'} (completions: {out / 'completions.jsonl'})")
