"""Data-parallel training: 2 CPU processes (gloo) make the same update as 1 process.

Both paths feed the same fixed experience (prompts, completions, advantages) through
``GRPOTrainer.update``: one process takes the whole global batch of 2 groups, each of 2 processes
takes one group. Rollouts are thereby identical by construction, and what is compared is exactly
what distribution changes: global token counts, gradient all-reduce, metric reduction.

This file is also the worker script: ``torchrun ... test_distributed.py CONFIG OUT`` runs
:func:`_worker` in each process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from grpokit.config import GRPOKitConfig, load_config
from grpokit.core.advantages import compute_advantages
from grpokit.errors import UserError
from grpokit.train.distributed import DistContext, launch_command, reduce_metrics, shard_slice
from grpokit.train.trainer import Experience, GRPOTrainer

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


def _fixed_batch() -> tuple[Experience, torch.Tensor]:
    """Two groups of 4 completions with uneven lengths, one row masked out; and 8 rewards."""
    g = torch.Generator().manual_seed(7)
    prompts = [[1, 9690, 198, 2683, 314], [1, 4093, 30, 1137]]
    prompt_ids, completion_ids = [], []
    for i in range(2 * GROUP):
        prompt_ids.append(prompts[i // GROUP])
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
    return {
        n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad
    }


def _worker(config: str, out: str) -> None:
    """One rank: update on its share of the fixed batch, save what it got, then train 1 step."""
    cfg = load_config(config, ["training.gradient_accumulation_steps=1"])
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    rank = trainer.dist.rank
    exp, rewards = _fixed_batch()
    rows = shard_slice(2, trainer.dist, "groups")
    rows = slice(rows.start * GROUP, rows.stop * GROUP)
    advantages = trainer._local_advantages(rewards[rows])
    metrics = trainer.update(_shard(exp, rows))
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


@pytest.fixture
def config(make_config: Callable[..., GRPOKitConfig]) -> GRPOKitConfig:
    return make_config(**TRAINING)


def test_two_processes_update_like_one(config: GRPOKitConfig, tmp_path: Path) -> None:
    assert config.config_path is not None
    out = tmp_path / "dist-out"
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
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    # Meanwhile, the single-process reference on the same global batch (its own run directory).
    single_cfg = config.model_copy(deep=True)
    single_cfg.training.output_dir = "run-single"
    single = GRPOTrainer(single_cfg, progress=False, log=lambda m: None)
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
    moved = max(float((expected[n] - before[n]).abs().max()) for n in expected)
    assert moved > 1e-3, "the update must change the parameters for the comparison to mean much"
    for name, want in expected.items():
        # Ranks apply the same summed gradient: identical to each other, and to one process.
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        torch.testing.assert_close(ranks[0]["params"][name], want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        torch.cat([ranks[0]["advantages"], ranks[1]["advantages"]]), expected_adv
    )
    for step_dist, step_single in zip(ranks[0]["metrics"], single_metrics, strict=True):
        for key in ("loss", "grad_norm", "kl"):
            assert step_dist[key] == pytest.approx(step_single[key], rel=1e-4, abs=1e-6), key

    # The 1-step run (one generation round, mu = 2 optimizer steps): rank 0 alone logged each
    # step once and wrote one checkpoint.
    run = config.output_dir
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"]
    logged = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == GROUP  # rank 0's own group only (two writers would give 2 x GROUP)


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
    _worker(sys.argv[1], sys.argv[2])
