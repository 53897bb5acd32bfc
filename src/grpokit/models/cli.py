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
    "mixes, made by its own quantiser from f16 (needs llama-cpp-python).",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
    help="Weights' dtype of an hf export.",
)
def export_cmd(checkpoint: str, fmt: str, out: Path, outtype: str, dtype: str) -> None:
    """Export CHECKPOINT (a checkpoint-N/, a run directory for its latest checkpoint, or a model
    directory) for use outside grpokit.

    \b
    Examples:
      grpokit export runs/demo/grpo --format gguf --out demo.gguf
      llama-cli -m demo.gguf -cnv
      grpokit export runs/demo/grpo --format gguf --quantize q4_k_m --out demo-q4.gguf
      grpokit export runs/demo/grpo/checkpoint-24 --format hf --out demo-hf/
    """
    from grpokit.models.export import export_checkpoint

    path = export_checkpoint(
        checkpoint,
        fmt=fmt,  # type: ignore[arg-type]
        out=out,
        outtype=outtype,  # type: ignore[arg-type]
        dtype=dtype,  # type: ignore[arg-type]
        log=lambda msg: click.echo(msg, err=True),
    )
    click.echo(f"exported: {path}")
