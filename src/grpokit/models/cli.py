"""Click commands of this package; the top-level ``grpokit`` group adds them."""

from __future__ import annotations

from pathlib import Path

import click

from grpokit.cli_options import out_option


@click.command("export")
@click.argument("checkpoint")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["hf", "gguf"]),
    required=True,
    help="hf: a Hugging Face model directory (LoRA merged, tokenizer and chat template "
    "included); gguf: one file for llama.cpp and the tools built on it.",
)
@out_option(
    "Directory to write (hf), or .gguf file (gguf; an existing directory gets a file named "
    "after the checkpoint).",
    required=True,
)
@click.option(
    "--outtype",
    "--quantize",
    "outtype",
    type=click.Choice(["f32", "f16", "q8_0", "q4_k_m", "q5_k_m", "q6_k"]),
    default="f16",
    show_default=True,
    help="GGUF tensor type (norms stay f32). q4_k_m, q5_k_m and q6_k are llama.cpp's k-quant "
    "mixes, made by its own quantiser from f16 (needs cyllama: pip install 'grpokit[gguf]').",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
    help="Weights' dtype of an hf export.",
)
@click.option(
    "--check",
    "check",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="After writing, compare greedy completions of this many held-out prompts (the run's "
    "data.heldout where the checkpoint has a run) from the checkpoint and from the export, in "
    "transformers (hf) or llama.cpp (gguf): 'k of n identical', stored beside the export, "
    "with a warning when a quantisation loses the trained format. 0 skips it.",
)
@click.option(
    "--best",
    is_flag=True,
    help="CHECKPOINT is a run directory: export the best checkpoint it recorded by "
    "training.metric_for_best_model (held-out eval), not its latest.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The config whose held-out prompts, system prompt and xml_format --check uses "
    "(default: the run's own config.yaml; a checkpoint without a run, such as an SFT output, "
    "is otherwise checked on a few general prompts).",
)
def export_cmd(
    checkpoint: str,
    fmt: str,
    out: Path,
    outtype: str,
    dtype: str,
    check: int,
    best: bool,
    config_path: Path | None,
) -> None:
    """Export CHECKPOINT (a checkpoint-N/, a run directory for its latest checkpoint (its best with
    --best or training.load_best_model_at_end), or a model directory) for use outside grpokit.

    \b
    Examples:
      grpokit export runs/demo/grpo --format gguf --out demo.gguf
      llama-cli -m demo.gguf -cnv
      grpokit export runs/demo/grpo --format gguf --quantize q4_k_m --out demo-q4.gguf
      grpokit export runs/demo/grpo/checkpoint-24 --format hf --out demo-hf/
      grpokit export runs/demo/grpo --best --format hf --out best-hf/
    """
    from grpokit.models.export import export_loaded, load_export_source

    def log(msg: str) -> None:
        click.echo(msg, err=True)

    if best:
        from grpokit.models.checkpoints import best_checkpoint

        chosen = best_checkpoint(Path(checkpoint).expanduser(), option="CHECKPOINT")
        log(f"the run's best checkpoint: {chosen}")
        checkpoint = str(chosen)

    loaded = load_export_source(
        checkpoint,
        fmt=fmt,  # type: ignore[arg-type]
        out=out,
        outtype=outtype,  # type: ignore[arg-type]
        dtype=dtype,  # type: ignore[arg-type]
    )
    path = export_loaded(loaded, fmt=fmt, out=out, outtype=outtype, log=log)  # type: ignore[arg-type]
    click.echo(f"exported: {path}")
    from grpokit.models import gguf_runtime

    if check and fmt == "gguf" and not gguf_runtime.available():
        # The export itself is done and sound; only the check needs llama.cpp in-process, an
        # optional install: say so instead of failing a finished export.
        click.echo(
            "fidelity: not checked: running the GGUF in llama.cpp needs cyllama "
            f"({gguf_runtime.INSTALL_HINT}, or pip install 'grpokit[gguf]'); --check 0 skips this note"
        )
        return
    if check:
        from grpokit.evaluate.fidelity import check_export, fidelity_prompts

        run_config = _run_config(checkpoint, config_path)
        prompts, system_prompt, tags = fidelity_prompts(run_config, check)
        result = check_export(
            loaded,
            path,
            fmt=fmt,
            outtype=outtype if fmt == "gguf" else dtype,
            prompts=prompts,
            system_prompt=system_prompt,
            format_tags=tags,
            log=log,
        )
        click.echo(result.summary)


def _run_config(checkpoint: str, given: Path | None) -> object | None:
    """``given``, else the config of the run ``checkpoint`` belongs to, else None (a bare model
    directory)."""
    from grpokit.config import load_config
    from grpokit.models.checkpoints import resolve_model

    if given is not None:
        return load_config(given)
    run_dir = resolve_model(checkpoint, option="CHECKPOINT").run_dir
    if run_dir is None or not (run_dir / "config.yaml").is_file():
        return None
    return load_config(run_dir / "config.yaml")


@click.command("models")
@click.option(
    "--prepare",
    "prepare",
    is_flag=True,
    help="Join each NAME's parts and convert it into the cache now (as its first use would), "
    "so a later run does not wait; scripts/setup.sh models calls this.",
)
@click.argument("names", nargs=-1)
def models_cmd(prepare: bool, names: tuple[str, ...]) -> None:
    """The named offline models: which are installed and converted, and what each costs.

    A config names one in model.name_or_path. Any GGUF file works there too (converted once into
    the cache), as does a Hugging Face model directory.

    \b
    Examples:
      grpokit models
      scripts/setup.sh models qwen2.5-coder-0.5b-instruct
      grpokit train cfg.yaml --set model.name_or_path=qwen2.5-coder-0.5b-instruct
    """
    from grpokit.errors import UserError
    from grpokit.hub.named import NAMED_MODELS, model_table, named_model, prepare_model

    unknown = [n for n in names if named_model(n) is None]
    if unknown:
        raise UserError(
            f"grpokit models: unknown model(s) {', '.join(unknown)}; known: "
            f"{', '.join(NAMED_MODELS)}"
        )
    if prepare:
        for name in names or tuple(NAMED_MODELS):
            click.echo(prepare_model(NAMED_MODELS[name]))
        return
    click.echo(model_table([NAMED_MODELS[n] for n in names] if names else None))
