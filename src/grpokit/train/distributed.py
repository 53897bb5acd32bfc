"""Data-parallel GRPO over several processes with ``torch.distributed`` (gloo on CPU, nccl on GPU).

A launcher (``torchrun``, ``accelerate launch``, or ``grpokit train --nproc N``, on several machines
``--nnodes M --node-rank R --master-addr HOST``) starts one process per device and sets ``RANK`` /
``WORLD_SIZE`` / ``LOCAL_RANK``; every process runs the same trainer on the same config.
``LOCAL_RANK`` (the process's number on its own machine) only picks its GPU: with several machines
each one has a ``LOCAL_RANK`` 0, so who writes, which share of the data and which seed all follow
the global ``RANK``. The split of work, and why each collective is there:

- every rank draws the same global list of prompts (same seeded order) and keeps a contiguous
  share of *whole groups*, so a group's advantages never need another rank's rewards;
- rewards are all-gathered before advantages, so ``scale_rewards: batch`` divides by the std of
  the whole global batch (with ``group`` the result is the same as the local one);
- the dapo denominator (active tokens) and the row count of the other loss types are summed over
  ranks, so every rank's loss is already normalised by *global* counts and the gradients are
  **summed**, not averaged: the update equals the single-process update on the same global batch;
- only rank 0 writes metrics, completions and checkpoints.

With ``training.fsdp``, :mod:`grpokit.train.fsdp` also shards the model over the same ranks.

Nothing here is called in a single process run: :data:`SINGLE` makes every helper a no-op.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from grpokit.errors import UserError

__all__ = [
    "DEFAULT_MASTER_PORT",
    "SINGLE",
    "DistContext",
    "Nodes",
    "all_reduce_gradients",
    "all_reduce_scalars",
    "barrier",
    "broadcast_parameters",
    "check_shared_run_dir",
    "gather_rows",
    "init_distributed",
    "launch",
    "launch_command",
    "reduce_metrics",
    "shard_slice",
]

DEFAULT_MASTER_PORT = 29500
"""torchrun's own default for ``--master-port``."""

_BUCKET_ELEMENTS = 1 << 24
"""Gradients are all-reduced in flat buckets of at most this many elements (64 MiB in float32):
one collective per bucket instead of one per parameter, without a second full copy of the grads."""


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in a data-parallel run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        """Whether collectives are needed (more than one process)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and checkpoints."""
        return self.rank == 0


SINGLE = DistContext()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw!r} is not an integer") from None


def init_distributed(device: torch.device) -> tuple[DistContext, torch.device]:
    """Join the process group the launcher described, or return :data:`SINGLE`.

    Args:
        device: the configured device; under CUDA each process takes ``cuda:LOCAL_RANK``.

    Returns:
        the context and the device this process should use.
    """
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return SINGLE, device
    ctx = DistContext(
        rank=_env_int("RANK", 0), world_size=world, local_rank=_env_int("LOCAL_RANK", 0)
    )
    if device.type == "cuda":
        device = torch.device("cuda", ctx.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        # Rollouts of different lengths keep ranks apart for minutes between collectives.
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=60))
    if dist.get_world_size() != world:
        raise UserError(
            f"WORLD_SIZE={world} but the process group has {dist.get_world_size()} processes"
        )
    return ctx, device


def shard_slice(n: int, ctx: DistContext, what: str = "prompts") -> slice:
    """This rank's contiguous share of ``n`` items (whole groups), equal for every rank.

    Raises:
        UserError: when ``n`` does not split evenly, naming the config fields to change.
    """
    if n % ctx.world_size:
        raise UserError(
            f"{n} {what} per step cannot be split evenly over {ctx.world_size} processes: make "
            f"training.per_device_train_batch_size x gradient_accumulation_steps a multiple of "
            f"num_generations, so each process gets whole groups"
        )
    share = n // ctx.world_size
    return slice(ctx.rank * share, (ctx.rank + 1) * share)


def all_reduce_scalars(values: Sequence[float], ctx: DistContext, op: str = "sum") -> list[float]:
    """Sum (or min / max) a few numbers over ranks in one collective; float64 keeps counts exact."""
    if not ctx.enabled:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(
        t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
    )
    return [float(x) for x in t.cpu().tolist()]


def gather_rows(local: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Concatenate every rank's (n, ...) tensor in rank order (equal n on every rank).

    Returns:
        (world_size * n, ...) on the input's device.
    """
    if not ctx.enabled:
        return local
    comm = local.detach().to(_comm_device()).contiguous()
    parts = [torch.empty_like(comm) for _ in range(ctx.world_size)]
    dist.all_gather(parts, comm)
    return torch.cat(parts).to(local.device)


def all_reduce_gradients(params: Iterable[torch.nn.Parameter], ctx: DistContext) -> None:
    """Sum the gradients of ``params`` over ranks, in place (a missing grad counts as zeros).

    The losses are normalised by global counts, so the sum is the global gradient.
    """
    if not ctx.enabled:
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in params:
        assert p.grad is not None
        if bucket and (size + p.grad.numel() > _BUCKET_ELEMENTS or bucket[0].dtype != p.grad.dtype):
            _reduce_bucket(bucket)
            bucket, size = [], 0
        bucket.append(p.grad)
        size += p.grad.numel()
    if bucket:
        _reduce_bucket(bucket)


def _reduce_bucket(grads: list[torch.Tensor]) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def broadcast_parameters(module: torch.nn.Module, ctx: DistContext) -> None:
    """Give every rank rank 0's parameters (a guard against unseeded initialisation, e.g. LoRA)."""
    if not ctx.enabled:
        return
    with torch.no_grad():
        for p in module.parameters():
            dist.broadcast(p.data, src=0)


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def check_shared_run_dir(run_dir: Path, ctx: DistContext) -> None:
    """Fail on every rank unless every rank sees the files rank 0 writes in ``run_dir``.

    Rank 0 alone writes the run, and every rank reads its checkpoints to resume: on several
    machines the directory must be one they all mount (NFS and the like) at the same path. Rank 0
    writes a one-off token there, the others read it back.

    Raises:
        UserError: on every rank, naming the hosts that do not see it.
    """
    if not ctx.enabled:
        return
    # A name and a token of rank 0's choosing, so that a stale copy of the directory fails too.
    shared = [f".grpokit-shared-{secrets.token_hex(4)}", secrets.token_hex(8)]
    dist.broadcast_object_list(shared, src=0)
    probe = run_dir / shared[0]
    if ctx.is_main:
        probe.write_text(shared[1], encoding="utf-8")
    barrier(ctx)
    try:
        seen = probe.read_text(encoding="utf-8") == shared[1]
    except OSError:
        seen = False
    views: list[tuple[str, bool] | None] = [None] * ctx.world_size
    dist.all_gather_object(views, (socket.gethostname(), seen))
    if ctx.is_main:
        probe.unlink(missing_ok=True)
    blind = [f"rank {r} on {v[0]}" for r, v in enumerate(views) if v is not None and not v[1]]
    if blind:
        host = views[0][0] if views[0] is not None else "?"
        raise UserError(
            f"{run_dir}: the run directory rank 0 writes (on {host}) is not the one "
            f"{', '.join(blind)} sees. Rank 0 alone writes checkpoints and every process reads them to "
            "resume: on several machines put training.output_dir (or --output-dir) on a "
            "filesystem every machine mounts at the same path"
        )


_SUMMED = ("loss", "num_tokens")


def reduce_metrics(
    metrics: dict[str, float], ctx: DistContext, weight: float = 1.0
) -> dict[str, float]:
    """Combine per-rank step metrics into global ones (every rank gets the result).

    Means are weighted by ``weight`` (e.g. the rank's token count for per-token metrics; the
    default 1 suits per-row metrics, as rank shares are equal). ``loss`` and ``num_tokens`` are
    summed (each rank's loss is already its share of the global loss); keys whose last part
    contains ``min`` / ``max`` take the minimum / maximum. NaN values (a rank with nothing to measure) and
    keys missing on some ranks are left out of their reduction rather than poisoning it.
    """
    if not ctx.enabled:
        return metrics
    gathered: list[list[str] | None] = [None] * ctx.world_size
    dist.all_gather_object(gathered, sorted(metrics))
    keys = sorted({k for ks in gathered if ks for k in ks})

    def kind(key: str) -> str:
        last = key.rsplit("/", 1)[-1]
        if key in _SUMMED:
            return "sum"
        return "min" if "min" in last else "max" if "max" in last else "mean"

    values = [float(metrics.get(k, float("nan"))) for k in keys]
    finite = [v == v and abs(v) != float("inf") for v in values]
    sums = all_reduce_scalars(
        [v * weight if ok else 0.0 for v, ok in zip(values, finite, strict=True)]
        + [v if ok else 0.0 for v, ok in zip(values, finite, strict=True)]
        + [weight if ok else 0.0 for ok in finite],
        ctx,
    )
    lows = all_reduce_scalars(
        [v if ok else float("inf") for v, ok in zip(values, finite, strict=True)], ctx, "min"
    )
    highs = all_reduce_scalars(
        [v if ok else float("-inf") for v, ok in zip(values, finite, strict=True)], ctx, "max"
    )
    any_finite = [lo != float("inf") for lo in lows]
    out: dict[str, float] = {}
    n = len(keys)
    for i, key in enumerate(keys):
        weighted, total, weights = sums[i], sums[n + i], sums[2 * n + i]
        if not any_finite[i]:
            out[key] = float("nan")
        elif kind(key) == "sum":
            out[key] = total
        elif kind(key) == "mean":
            out[key] = weighted / weights if weights > 0 else total / ctx.world_size
        else:
            out[key] = lows[i] if kind(key) == "min" else highs[i]
    return out


def _comm_device() -> torch.device:
    """nccl needs CUDA tensors; gloo takes CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---- launching ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Nodes:
    """This machine's place among the machines of a run (torchrun's static rendezvous)."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    """The address of machine 0, which holds rank 0 and so writes the run's files."""
    master_port: int = DEFAULT_MASTER_PORT

    def torchrun_args(self) -> list[str]:
        """torchrun's flags for this machine; one machine alone is ``--standalone``."""
        if self.nnodes < 1:
            raise UserError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise UserError(
                f"--node-rank must be 0 to {self.nnodes - 1} with --nnodes {self.nnodes}"
            )
        if self.nnodes == 1:
            return ["--standalone"]
        if not self.master_addr:
            raise UserError(
                "--nnodes > 1 needs --master-addr: the address of the machine started with "
                "--node-rank 0, reachable from every machine"
            )
        if not 0 < self.master_port < 65536:
            raise UserError(f"--master-port must be 1 to 65535, got {self.master_port}")
        return [
            f"--nnodes={self.nnodes}",
            f"--node-rank={self.node_rank}",
            f"--master-addr={self.master_addr}",
            f"--master-port={self.master_port}",
        ]


def launch_command(nproc: int, grpokit_args: Sequence[str], nodes: Nodes = Nodes()) -> list[str]:
    """The torchrun command line that runs ``grpokit <grpokit_args>`` in ``nproc`` processes on
    this machine: every machine of a multi-node run runs it with its own ``nodes.node_rank``."""
    if nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *nodes.torchrun_args(),
        f"--nproc-per-node={nproc}",
        "-m",
        "grpokit",
        *grpokit_args,
    ]


def launch(nproc: int, grpokit_args: Sequence[str], nodes: Nodes = Nodes()) -> int:
    """Run ``grpokit <grpokit_args>`` in ``nproc`` processes on this machine; returns the exit
    code."""
    cmd = launch_command(nproc, grpokit_args, nodes)
    if shutil.which(sys.executable) is None:  # pragma: no cover - the running interpreter exists
        raise UserError(f"cannot find the Python interpreter {sys.executable}")
    env = dict(os.environ)
    # Each process gets its share of this machine's cores instead of all of them.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return subprocess.call(cmd, env=env)
