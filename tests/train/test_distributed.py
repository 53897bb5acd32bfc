"""Data-parallel and fully sharded (FSDP) training: 2 CPU processes (gloo) make the same update
as 1 process.

Both paths feed the same fixed experience (prompts, completions, advantages) through
``GRPOTrainer.update``: one process takes the whole global batch of 2 groups, each of 2 processes
takes one group. Rollouts are thereby identical by construction, and what is compared is exactly
what distribution changes: global token counts, gradient all-reduce (or FSDP's reduce-scatter),
metric reduction; under FSDP also the rollout on gathered weights, checkpoints and resuming.

This file is also the worker script: ``torchrun ... test_distributed.py CONFIG OUT MODE`` runs
:func:`_worker` (MODE ``dp``) or :func:`_fsdp_worker` (MODE ``fsdp``) in each process.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from float64_identity import to_float64, use_rms_norm_in_input_precision
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

import grpokit
from grpokit.config import GRPOKitConfig, load_config
from grpokit.core.advantages import compute_advantages
from grpokit.errors import UserError
from grpokit.models.loading import load_policy
from grpokit.rollout.base import SamplingParams
from grpokit.train.distributed import (
    DistContext,
    Nodes,
    launch_command,
    reduce_metrics,
    shard_slice,
)
from grpokit.train.fsdp import full_state, gathered, shard_policy
from grpokit.train.rollout_record import Rollout
from grpokit.train.trainer import GRPOTrainer

GROUP = 4
TRAINING = {
    "num_generations": GROUP,
    "per_device_train_batch_size": GROUP,
    "gradient_accumulation_steps": 2,  # 1 process: 2 micro-batches; 2 processes: 1 each
    "beta": 0.04,
    "num_iterations": 2,  # exercises the old-log-prob pass and two optimizer steps
    "loss_type": "dapo",
    "scale_rewards": "batch",  # needs the global std
    "max_steps": 1,
    "learning_rate": 1e-2,
    "log_completions": True,
}
# FSDP: micro-batches of 2 completions, so 1 process accumulates 4 of them and each of 2 processes
# 2; a constant learning rate, so that a second update still moves the parameters; held-out eval
# at every step (rank 0 generates alone on weights every rank helps gather).
FSDP_TRAINING = {
    **TRAINING,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "lr_scheduler_type": "constant",
    "eval_steps": 1,
}
PROMPTS = [[1, 9690, 198, 2683, 314], [1, 4093, 30, 1137]]
SRC = Path(__file__).resolve().parents[2] / "src"
ROLLOUT_SEED = 123


def _fixed_batch() -> tuple[Rollout, torch.Tensor]:
    """Two groups of 4 completions with uneven lengths, one row masked out; and 8 rewards."""
    g = torch.Generator().manual_seed(7)
    prompt_ids, completion_ids = [], []
    for i in range(2 * GROUP):
        prompt_ids.append(PROMPTS[i // GROUP])
        length = int(torch.randint(2, 9, (1,), generator=g))
        completion_ids.append(torch.randint(3, 20000, (length,), generator=g).tolist())
    advantages = torch.randn(2 * GROUP, generator=g)
    mask_rows = torch.ones(2 * GROUP)
    mask_rows[5] = 0.0  # a truncated completion left out of the loss
    rewards = torch.rand(2 * GROUP, generator=g)
    return Rollout(prompt_ids, completion_ids, advantages, mask_rows), rewards


def _shard(exp: Rollout, rows: slice) -> Rollout:
    return Rollout(
        exp.prompt_ids[rows],
        exp.completion_ids[rows],
        exp.advantages[rows],
        exp.loss_mask_rows[rows],
    )


def _trainable(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    """The trainable parameters, whole (an FSDP shard is gathered: every rank must call this)."""
    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in trainer.policy.model.named_parameters()
        if p.requires_grad
    }


def _rollout(trainer: GRPOTrainer, max_completion_length: int = 8) -> list[list[int]]:
    batch = trainer.engine.generate(
        PROMPTS,
        2,
        SamplingParams(max_completion_length=max_completion_length),
        generator=torch.Generator().manual_seed(ROLLOUT_SEED),
    )
    return batch.completion_ids


def _update_on_share(trainer: GRPOTrainer) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """This rank's advantages of the fixed rewards and the metrics of its update on its groups."""
    exp, rewards = _fixed_batch()
    rows = shard_slice(2, trainer.dist, "groups")
    rows = slice(rows.start * GROUP, rows.stop * GROUP)
    advantages = trainer._local_advantages(rewards[rows], rewards[rows, None])
    return advantages, trainer.update(_shard(exp, rows))


def _worker(config: str, out: str) -> None:
    """One rank: update on its share of the fixed batch, save what it got, then train 1 step.
    In float64, as the single-process reference (an identity; see float64_identity.py)."""
    cfg = load_config(config, ["training.gradient_accumulation_steps=1"])
    use_rms_norm_in_input_precision()
    trainer = to_float64(GRPOTrainer(cfg, progress=False, log=lambda m: None))
    rank = trainer.dist.rank
    advantages, metrics = _update_on_share(trainer)
    torch.save(
        {
            "params": _trainable(trainer),
            "advantages": advantages,
            "metrics": metrics,
            "num_processes": trainer.args.num_processes,
        },
        Path(out) / f"rank{rank}.pt",
    )
    trainer.train()  # a real step end to end: rollout, rewards, update, rank-0 logging, checkpoint


def _fsdp_worker(config: str, out: str) -> None:
    """One FSDP rank: a rollout on gathered weights, the update on its share of the fixed batch
    and a checkpoint of that state; then a real step, and a resume from its checkpoint."""
    cfg = load_config(config, ["training.gradient_accumulation_steps=2", "training.fsdp=true"])
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    assert trainer.sharded
    rank = trainer.dist.rank
    with gathered(trainer.policy.model):
        whole = {
            n: (type(p).__name__, tuple(p.shape))
            for n, p in trainer.policy.model.named_parameters()
        }
    # Ranks decode different numbers of tokens: the rollout must need no collective per token.
    rollout = _rollout(trainer, 8 if rank == 0 else 3)
    advantages, metrics = _update_on_share(trainer)
    params = _trainable(trainer)
    trainer.save()  # checkpoint-0: the state right after the update
    if rank == 0:
        shutil.move(cfg.output_dir / "checkpoint-0", Path(out) / "checkpoint-0")
    # A second update with every row on rank 0 (as dynamic sampling can leave a rank without
    # groups): rank 1 joins each forward and backward with idle passes.
    exp, _ = _fixed_batch()
    uneven_metrics = trainer.update(exp if rank == 0 else _shard(exp, slice(0, 0)))
    torch.save(
        {
            "whole": whole,
            "rollout": rollout,
            "params": params,
            "advantages": advantages,
            "metrics": metrics,
            "uneven": {"params": _trainable(trainer), "metrics": uneven_metrics},
        },
        Path(out) / f"rank{rank}.pt",
    )
    trainer.train()  # one generation round, mu = 2 optimizer steps: checkpoint-2

    resumed = GRPOTrainer(cfg, resume=True, progress=False, log=lambda m: None)
    restored = {"params": _trainable(resumed), "step": resumed.state.global_step}
    restored["optimizer"] = full_state(resumed.policy.model, resumed.optimizer)[1]
    torch.save(restored, Path(out) / f"resumed{rank}.pt")
    resumed.total_steps = 4
    resumed.train()


def _nodes_worker(config: str, out: str) -> None:
    """One process of a two-machine run (one process on each): the ``dp`` worker's update on its
    share, in float32 (so that the checkpoint resumes into the command's float32 model), with the
    launcher's variables and where grpokit was imported from; then a real step, and what a resume
    from its checkpoint restores."""
    cfg = load_config(config, ["training.gradient_accumulation_steps=1"])
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    advantages, metrics = _update_on_share(trainer)
    launcher = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    torch.save(
        {
            "params": _trainable(trainer),
            "advantages": advantages,
            "metrics": metrics,
            "env": {k: os.environ.get(k) for k in launcher},
            "grpokit": grpokit.__file__,
        },
        Path(out) / f"rank{trainer.dist.rank}.pt",
    )
    trainer.train()  # rank 0 alone logs and writes checkpoint-2

    # Both machines restore rank 0's checkpoint; each draws its own samples from there on.
    resumed = GRPOTrainer(cfg, resume=True, progress=False, log=lambda m: None)
    torch.save(
        {
            "params": _trainable(resumed),
            "step": resumed.state.global_step,
            "generator": resumed.generator.get_state(),
        },
        Path(out) / f"resumed{resumed.dist.rank}.pt",
    )


def _env() -> dict[str, str]:
    """This environment without a launcher's variables, importing grpokit from this checkout."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in launcher and not k.startswith(("TORCHELASTIC_", "GROUP_", "LOCAL_WORLD"))
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(SRC))
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(config: GRPOKitConfig, out: Path, mode: str) -> subprocess.Popen[bytes]:
    """Start this file as the worker script in 2 processes."""
    assert config.config_path is not None
    out.mkdir()
    env = _env()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(Path(__file__).resolve()),
        str(config.config_path),
        str(out),
        mode,
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _single(
    config: GRPOKitConfig, log: Callable[[str], None] = lambda m: None, **training: object
) -> GRPOTrainer:
    """The single-process reference trainer, in its own run directory."""
    cfg = config.model_copy(deep=True)
    cfg.training.output_dir = "run-single"
    for key, value in training.items():
        setattr(cfg.training, key, value)
    return GRPOTrainer(cfg, progress=False, log=log)


def _assert_same_update(
    ranks: list[dict],
    single_metrics: list[dict[str, float]],
    before: dict,
    expected: dict,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    adam_bound: float | None = None,
) -> None:
    """Equal updates; the default tolerances are float32's (FSDP), float64 passes its own.

    ``adam_bound``: AdamW normalises each element's step to about the learning rate whatever the
    gradient's size, so an element whose gradient is within float32 rounding of zero (the two
    ways of summing differ there by ~1e-7 of the summed terms) may take any step up to that
    bound. Given, at most 1 element in 1,000 may leave the float32 tolerance, and none by more
    than ``adam_bound`` (the float64 two-process test holds every element)."""
    moved = max(float((expected[n] - before[n]).abs().max()) for n in expected)
    assert moved > 1e-3, "the update must change the parameters for the comparison to mean much"
    outside, total = 0, 0
    for name, want in expected.items():
        # Ranks apply the same summed gradient: identical to each other, and to one process.
        got = ranks[0]["params"][name]
        assert torch.equal(got, ranks[1]["params"][name]), name
        if adam_bound is None:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
            continue
        diff = (got - want).abs()
        outside += int((diff > atol + rtol * want.abs()).sum())
        total += diff.numel()
        assert float(diff.max()) <= adam_bound, (name, float(diff.max()))
    assert outside <= total / 1000, (outside, total)
    for step_dist, step_single in zip(ranks[0]["metrics"], single_metrics, strict=True):
        for key in ("loss", "grad_norm", "kl"):
            assert step_dist[key] == pytest.approx(step_single[key], rel=rtol, abs=atol / 10), key


@pytest.fixture
def config(make_config: Callable[..., GRPOKitConfig]) -> GRPOKitConfig:
    return make_config(**TRAINING)


@pytest.mark.slow  # torchrun with two processes: 10 s on 2 cores (FSDP's case stays default)
def test_two_processes_update_like_one(
    config: GRPOKitConfig, float64: Callable[[GRPOTrainer], GRPOTrainer], tmp_path: Path
) -> None:
    out = tmp_path / "dist-out"
    proc = _torchrun(config, out, "dp")

    # Meanwhile, the single-process reference on the same global batch (its own run directory),
    # in float64 as the workers.
    single = float64(_single(config))
    assert not single.dist.enabled
    exp, rewards = _fixed_batch()
    before = _trainable(single)
    single_metrics = single.update(exp)
    expected = _trainable(single)
    expected_adv = compute_advantages(rewards, GROUP, scale="batch")

    stdout, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, stdout.decode()[-4000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]

    assert [r["num_processes"] for r in ranks] == [2, 2]
    _assert_same_update(ranks, single_metrics, before, expected, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(
        torch.cat([ranks[0]["advantages"], ranks[1]["advantages"]]), expected_adv
    )

    # The 1-step run (one generation round, mu = 2 optimizer steps): rank 0 alone logged each
    # step once and wrote one checkpoint.
    run = config.output_dir
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"]
    logged = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == GROUP  # rank 0's own group only (two writers would give 2 x GROUP)


def _assert_same_files(a: Path, b: Path) -> None:
    """Two checkpoints hold the same files, tensors equal within float tolerance."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for name in files:
        if name.suffix == ".safetensors":
            x, y = load_file(a / name), load_file(b / name)
            assert sorted(x) == sorted(y), name
            for key in x:
                torch.testing.assert_close(x[key], y[key], rtol=1e-4, atol=1e-5, msg=key)
    x, y = (torch.load(d / "optimizer.pt", weights_only=False) for d in (a, b))
    assert x["param_groups"] == y["param_groups"]
    assert sorted(x["state"]) == sorted(y["state"])
    for i in x["state"]:
        for key, value in x["state"][i].items():
            torch.testing.assert_close(value, y["state"][i][key], rtol=1e-4, atol=1e-6)


# The default run keeps one FSDP case: every forward there is a collective, so a rank that runs
# one forward fewer than the others (one with no rows, say) hangs the group, as nothing else shows.
@pytest.mark.parametrize(
    "model",
    [{}, pytest.param({"lora": {"r": 4, "alpha": 8}}, marks=pytest.mark.slow)],
    ids=["full", "lora"],
)  # two torchrun launches and a resume: 12 s each on 2 cores
def test_fsdp_two_processes_update_like_one_and_resume(
    make_config: Callable[..., GRPOKitConfig], model: dict, tmp_path: Path
) -> None:
    config = make_config(model=model, **FSDP_TRAINING)
    out = tmp_path / "fsdp-out"
    proc = _torchrun(config, out, "fsdp")

    # fsdp with one process is a no-op that says so; the reference takes 4 micro-batches.
    notes: list[str] = []
    single = _single(config, log=notes.append, fsdp=True)
    assert not single.sharded and any("FSDP needs 2+ processes" in n for n in notes)
    shapes = {n: tuple(p.shape) for n, p in single.policy.model.named_parameters()}
    rollout = _rollout(single)
    exp, _ = _fixed_batch()
    before = _trainable(single)
    single_metrics = single.update(exp)
    expected = _trainable(single)
    single_checkpoint = single.save()
    uneven_metrics = single.update(exp)

    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout.decode()[-4000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]

    # Inside gathered(), every parameter is a plain tensor of its whole size.
    for r in ranks:
        assert r["whole"] == {n: ("Parameter", s) for n, s in shapes.items()}
    # The same seed samples the same tokens as one process; rank 1 stopped after 3.
    assert ranks[0]["rollout"] == rollout
    assert ranks[1]["rollout"] == [c[:3] for c in rollout]
    _assert_same_update(ranks, single_metrics, before, expected)
    # Rank 0 wrote the files one process writes, with the same numbers.
    _assert_same_files(out / "checkpoint-0", single_checkpoint)
    _assert_same_update([r["uneven"] for r in ranks], uneven_metrics, expected, _trainable(single))

    # Resuming under FSDP restores the checkpoint exactly, then the run continues.
    run = config.output_dir
    saved = load_file(run / "checkpoint-2" / "trainable.safetensors")
    saved_optimizer = torch.load(run / "checkpoint-2" / "optimizer.pt", weights_only=False)
    for r in range(2):
        resumed = torch.load(out / f"resumed{r}.pt", weights_only=False)
        assert resumed["step"] == 2
        assert sorted(resumed["params"]) == sorted(saved)
        assert all(torch.equal(resumed["params"][n], saved[n]) for n in saved)
        if r == 0:  # the gathered optimizer state exists on rank 0 only
            assert resumed["optimizer"]["param_groups"] == saved_optimizer["param_groups"]
            for i, state in saved_optimizer["state"].items():
                for key, value in state.items():
                    assert torch.equal(resumed["optimizer"]["state"][i][key], value), (i, key)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    assert all(0.0 <= x["eval/reward"] <= 1.0 for x in lines)
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def _two_nodes(
    commands: list[list[str]], meanwhile: Callable[[], None] = lambda: None
) -> list[tuple[int, str]]:
    """Run one command per "machine" (two processes started apart, as on two hosts), and
    ``meanwhile`` here while they run; each one's exit status and output."""
    procs = [
        subprocess.Popen(c, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for c in commands
    ]
    try:
        meanwhile()
        outputs = [p.communicate(timeout=300)[0].decode() for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, text) for p, text in zip(procs, outputs, strict=True)]


def _grpokit_nodes(*args: str) -> list[list[str]]:
    """`grpokit ARGS` on two machines, grpokit's own form (machine 0 at 127.0.0.1)."""
    where = ("--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_port()))
    return [
        [sys.executable, "-m", "grpokit", *args, *where, "--node-rank", str(node)]
        for node in range(2)
    ]


@pytest.mark.slow  # four launches of torchrun and grpokit: about 55 CPU seconds, 90 s on 2 cores
def test_two_nodes_update_like_one_process_and_resume(
    config: GRPOKitConfig, tmp_path: Path
) -> None:
    """Two machines of one process each, as torchrun starts them with a c10d rendezvous (here
    both on localhost, gloo): LOCAL_RANK is 0 on both while RANK is 0 and 1. The update equals one
    process's, rank 0 alone writes the run, and `grpokit train RUN --nnodes 2` resumes it."""
    assert config.config_path is not None
    out = tmp_path / "nodes-out"
    out.mkdir()
    port = _free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=grpokit"]
    worker = [str(Path(__file__).resolve()), str(config.config_path), str(out), "nodes"]
    reference: dict[str, Any] = {}

    def single_process() -> None:
        """The single-process reference on the same global batch (float32, as the workers: one
        process accumulates 2 micro-batches where 2 processes sum over gloo)."""
        single = _single(config)
        reference["before"] = _trainable(single)
        reference["metrics"] = single.update(_fixed_batch()[0])
        reference["after"] = _trainable(single)

    # On two hosts the endpoint's own host serves the rendezvous; on one, say which does.
    commands = [
        [*torchrun, *rendezvous, f"--rdzv-conf=is_host={int(node == 0)}", *worker]
        for node in range(2)
    ]
    for status, text in _two_nodes(commands, single_process):
        assert status == 0, text[-4000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]

    # What the launcher set: a local rank 0 on each machine, global ranks 0 and 1.
    assert [r["env"]["RANK"] for r in ranks] == ["0", "1"]
    assert [r["env"]["LOCAL_RANK"] for r in ranks] == ["0", "0"]
    assert sorted(r["env"]["GROUP_RANK"] for r in ranks) == ["0", "1"]  # the machine's number
    assert [r["env"]["WORLD_SIZE"] for r in ranks] == ["2", "2"]
    assert all(Path(r["grpokit"]).is_relative_to(SRC) for r in ranks)  # this checkout's code
    # float32: the two ways of summing the same gradients differ in rounding (~1e-7 relative),
    # which AdamW's two steps at lr 1e-2 carry into the weights: the FSDP test's tolerances, but
    # for elements whose gradient is rounding-sized (one in 8,192 moved 3.1e-5 in a CI run),
    # held to AdamW's step bound, 2 x lr per step.
    bound = 2 * TRAINING["learning_rate"] * TRAINING["num_iterations"]
    _assert_same_update(
        ranks, reference["metrics"], reference["before"], reference["after"], adam_bound=bound
    )
    torch.testing.assert_close(
        torch.cat([ranks[0]["advantages"], ranks[1]["advantages"]]),
        compute_advantages(_fixed_batch()[1], GROUP, scale="batch"),
    )

    run = config.output_dir
    saved = load_file(run / "checkpoint-2" / "trainable.safetensors")
    restored = [torch.load(out / f"resumed{r}.pt", weights_only=False) for r in range(2)]
    for r in restored:
        assert r["step"] == 2 and sorted(r["params"]) == sorted(saved)
        assert all(torch.equal(r["params"][n], saved[n]) for n in saved)
    # Seeded by RANK, not LOCAL_RANK (0 on both): the machines sample different completions.
    assert not torch.equal(restored[0]["generator"], restored[1]["generator"])
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]  # logged once, by rank 0
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"]
    completions = (run / "completions.jsonl").read_text().splitlines()
    assert len(completions) == GROUP  # rank 0's group only
    assert not list(run.glob(".grpokit-shared-*"))  # the shared-directory probe is gone

    # Resume on both machines with grpokit's own form (torchrun's static rendezvous: machine 0
    # holds rank 0), one generation round (mu = 2 optimizer steps) further.
    resumed = _two_nodes(_grpokit_nodes("train", str(run), "--set", "training.max_steps=4"))
    for status, text in resumed:
        assert status == 0, text[-4000:]
    said = "".join(text for _, text in resumed)
    assert said.count("resumed from") == 1 and "at step 2" in said, said[-4000:]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert len((run / "completions.jsonl").read_text().splitlines()) == 2 * GROUP


def test_fsdp_in_one_process_of_a_group_of_one(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    """A single process that has joined a process group of one itself shards (the FSDP code on
    one device, as bench/gpu_check.py runs it on a GPU) and updates as it does unsharded."""
    config = make_config(**FSDP_TRAINING)
    exp, _ = _fixed_batch()
    unsharded = _single(config, fsdp=True)  # no process group: fsdp is ignored
    assert not unsharded.sharded
    before = _trainable(unsharded)
    unsharded_metrics = unsharded.update(exp)
    expected = _trainable(unsharded)
    unsharded.close()

    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cfg = config.model_copy(deep=True)
        cfg.training.fsdp = True
        trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
        assert trainer.sharded and trainer.dist.world_size == 1
        assert all(isinstance(p, DTensor) for p in trainer.policy.model.parameters())
        metrics = trainer.update(exp)
        got = _trainable(trainer)
        trainer.close()
    finally:
        dist.destroy_process_group()
    assert max(float((expected[n] - before[n]).abs().max()) for n in expected) > 1e-3
    for name, want in expected.items():
        torch.testing.assert_close(got[name], want, rtol=1e-4, atol=1e-5)
    for step, step_unsharded in zip(metrics, unsharded_metrics, strict=True):
        assert step["loss"] == pytest.approx(step_unsharded["loss"], rel=1e-4, abs=1e-6)


def test_fsdp_names_the_setting_when_no_layer_matches(tiny_model_dir: Path) -> None:
    policy = load_policy(str(tiny_model_dir), need_reference=True)
    with pytest.raises(UserError, match="NoSuchLayer.*fsdp_config.transformer_layer_cls_to_wrap"):
        shard_policy(policy, torch.device("cpu"), 2, layer_classes=["NoSuchLayer"])
    # Found before anything is sharded: the model is left whole.
    assert not any(isinstance(p, DTensor) for p in policy.model.parameters())


def test_uneven_groups_are_a_user_error() -> None:
    with pytest.raises(UserError, match="num_generations"):
        shard_slice(3, DistContext(rank=0, world_size=2))
    assert shard_slice(4, DistContext(rank=1, world_size=2)) == slice(2, 4)


def test_single_process_helpers_are_identity() -> None:
    metrics = {"loss": 1.5, "completions/min_length": 2.0}
    assert reduce_metrics(metrics, DistContext()) is metrics


def test_launch_command_runs_grpokit_under_torchrun() -> None:
    cmd = launch_command(4, ["train", "cfg.yaml"])
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in cmd
    assert cmd[-4:] == ["-m", "grpokit", "train", "cfg.yaml"]
    with pytest.raises(UserError):
        launch_command(0, ["train"])
    # One machine's share of several: the static rendezvous at machine 0's address.
    cmd = launch_command(2, ["train", "c.yaml"], Nodes(3, 2, "10.0.0.1"))
    flags = ["--nnodes=3", "--node-rank=2", "--master-addr=10.0.0.1", "--master-port=29500"]
    assert cmd[3:7] == flags and "--standalone" not in cmd
    assert "--nproc-per-node=2" in cmd
    with pytest.raises(UserError, match="--master-addr"):
        launch_command(1, ["train"], Nodes(2))
    with pytest.raises(UserError, match="--node-rank must be 0 to 1"):
        launch_command(1, ["train"], Nodes(2, 2, "h"))


@pytest.mark.slow  # two torchrun nodes on localhost: 9 s on 2 cores
def test_two_nodes_refuse_run_directories_that_differ(
    config: GRPOKitConfig, tmp_path: Path
) -> None:
    """Machines that do not see one run directory (here: each given its own) stop, each with
    the message, before a model is loaded; rank 0 removed its probe file."""
    assert config.config_path is not None
    commands = _grpokit_nodes("train", str(config.config_path))
    for node, command in enumerate(commands):
        command += ["--output-dir", str(tmp_path / f"node{node}")]
    for status, text in _two_nodes(commands):
        assert status != 0, text[-4000:]
        assert "is not the one rank 1 on" in text and "filesystem every machine mounts" in text
    assert not list(tmp_path.glob("node*/.grpokit-shared-*"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"dp": _worker, "fsdp": _fsdp_worker, "nodes": _nodes_worker}[sys.argv[3]](
        sys.argv[1], sys.argv[2]
    )
