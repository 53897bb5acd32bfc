"""Click commands of this package; the top-level ``grpokit`` group adds them."""

from __future__ import annotations

import os
import shlex

import click


@click.command("vllm-serve")
@click.option(
    "--model",
    "model_name",
    required=True,
    help="What the training config's model.name_or_path says: a model directory, a hub id or "
    "the embedded model's name.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
    help="What the trainer computes in, as model.dtype says it: 'auto' is bfloat16 on a CPU "
    "with native bfloat16, float32 elsewhere.",
)
@click.option(
    "--memory-share",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.3,
    show_default=True,
    help="As training.vllm_gpu_memory_utilization: on a GPU the share of its memory vLLM "
    "takes; on CPU the share of the free host memory its KV cache may take.",
)
@click.option(
    "--max-model-len", type=int, default=None, help="Longest prompt + completion (tokens)."
)
@click.option(
    "--max-num-seqs",
    type=int,
    default=None,
    help="Most sequences at once: the rows of one generation call "
    "(per_device_train_batch_size x gradient_accumulation_steps).",
)
def vllm_serve_cmd(
    model_name: str,
    host: str,
    port: int,
    dtype: str,
    memory_share: float,
    max_model_len: int | None,
    max_num_seqs: int | None,
) -> None:
    """Serve a model with vLLM for `vllm_mode: server` without NCCL (weights pushed as files).

    Runs vLLM's OpenAI-compatible server with grpokit's weight-reload extension; point
    training.vllm_server_base_url at http://HOST:PORT. See docs/vllm.md.
    """
    import torch
    from transformers import AutoConfig

    from grpokit.hub.resolve import resolve_model_path
    from grpokit.models.onednn import bf16_compute_applies
    from grpokit.rollout.vllm_engine import memory_args, require_vllm
    from grpokit.rollout.vllm_server import server_command

    platform = require_vllm()
    path = resolve_model_path(model_name)
    if dtype == "auto":
        on_cpu = platform == "cpu" and bf16_compute_applies(torch.device("cpu"))
        dtype = "bfloat16" if on_cpu else "float32"
    memory = memory_args(
        platform,
        memory_share,
        AutoConfig.from_pretrained(path),
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
    )
    cmd = server_command(
        path,
        port=port,
        host=host,
        dtype=dtype,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        enforce_eager=platform == "cpu",
        **memory,
    )
    click.echo(f"starting: VLLM_SERVER_DEV_MODE=1 {shlex.join(cmd)}", err=True)
    os.execvpe(cmd[0], cmd, {**os.environ, "VLLM_SERVER_DEV_MODE": "1"})
