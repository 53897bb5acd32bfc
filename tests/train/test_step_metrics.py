"""Step metrics that need more than TRL's: which zero-std groups are solved rather than stalled,
and the process's peak memory."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from grpokit.rewards.compose import RewardScores
from grpokit.train.step_metrics import (
    generation_rate,
    memory_metrics,
    solved_group_mask,
    step_summary,
)


def _scores(rows: list[list[float]]) -> RewardScores:
    per = torch.tensor(rows, dtype=torch.float32)
    return RewardScores(
        names=["format", "answer"],
        per_function=per,
        gated_out=torch.zeros_like(per, dtype=torch.bool),
        total=per.nan_to_num(0).sum(dim=1),
        metrics={},
    )


def test_a_group_is_solved_when_every_completion_tops_every_reward() -> None:
    nan = math.nan
    scores = _scores(
        [
            [1.0, 1.0], [1.0, 1.0],  # solved
            [1.0, 0.0], [1.0, 0.0],  # the same reward, unsolved: stalled
            [1.0, 1.0], [1.0, nan],  # a reward not given is not reached
        ]
    )  # fmt: skip
    mask = solved_group_mask(scores, [1.0, 1.0], group_size=2)
    assert mask is not None and mask.tolist() == [True, False, False]
    # a reward without a maximum: no way to tell solved from stalled
    assert solved_group_mask(scores, [1.0, None], group_size=2) is None


def _resident_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20  # kB
    raise AssertionError("no VmRSS")


def test_memory_metrics_report_the_peak_so_far() -> None:
    before = memory_metrics(torch.device("cpu"))
    assert set(before) == {"memory/max_rss_gib"}  # no CUDA figures for a CPU run
    assert before["memory/max_rss_gib"] >= _resident_gib() - 1e-3
    # 512 MiB touched and freed: the peak rises by about that and stays up once freed
    block = torch.ones(2**27)
    held = _resident_gib()
    del block
    after = memory_metrics(torch.device("cpu"))["memory/max_rss_gib"]
    assert after >= held - 1e-3 and after >= before["memory/max_rss_gib"]


def test_the_progress_line_shows_the_generation_speed() -> None:
    record = {"reward": 0.5, "frac_reward_zero_std": 0.25}
    assert step_summary(record) == "reward 0.500  zero-std 0.25"
    record |= generation_rate(tokens=332, seconds=8.0)
    assert record["generate/tokens_per_second"] == 41.5
    assert step_summary(record) == "reward 0.500  zero-std 0.25  gen 41.5 tok/s"
    assert step_summary(record | generation_rate(2718, 2.0)).endswith("gen 1359 tok/s")
    assert generation_rate(100, 0.0) == {}  # nothing measured: no rate, not a division by 0
