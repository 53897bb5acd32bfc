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
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from float64_identity import to_float64, use_rms_norm_in_input_precision
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from grpokit.config import GRPOKitConfig, load_config
from grpokit.core.advantages import compute_advantages
from grpokit.errors import UserError
from grpokit.models.loading import load_policy
from grpokit.rollout.base import SamplingParams
from grpokit.train.distributed import DistContext, launch_command, reduce_metrics, shard_slice
from grpokit.train.experience import Experience
from grpokit.train.fsdp import full_state, gathered, shard_policy
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
ROLLOUT_SEED = 123


def _fixed_batch() -> tuple[Experience, torch.Tensor]:
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
    return Experience(prompt_ids, completion_ids, advantages, mask_rows), rewards


def _shard(exp: Experience, rows: slice) -> Experience:
    return Experience(
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


def _torchrun(config: GRPOKitConfig, out: Path, mode: str) -> subprocess.Popen[bytes]:
    """Start this file as the worker script in 2 processes."""
    assert config.config_path is not None
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
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
) -> None:
    """Equal updates; the default tolerances are float32's (FSDP), float64 passes its own."""
    moved = max(float((expected[n] - before[n]).abs().max()) for n in expected)
    assert moved > 1e-3, "the update must change the parameters for the comparison to mean much"
    for name, want in expected.items():
        # Ranks apply the same summed gradient: identical to each other, and to one process.
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        torch.testing.assert_close(ranks[0]["params"][name], want, rtol=rtol, atol=atol)
    for step_dist, step_single in zip(ranks[0]["metrics"], single_metrics, strict=True):
        for key in ("loss", "grad_norm", "kl"):
            assert step_dist[key] == pytest.approx(step_single[key], rel=rtol, abs=atol / 10), key


@pytest.fixture
def config(make_config: Callable[..., GRPOKitConfig]) -> GRPOKitConfig:
    return make_config(**TRAINING)


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


@pytest.mark.parametrize("model", [{}, {"lora": {"r": 4, "alpha": 8}}], ids=["full", "lora"])
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


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"dp": _worker, "fsdp": _fsdp_worker}[sys.argv[3]](sys.argv[1], sys.argv[2])
