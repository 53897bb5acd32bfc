"""multi_objective_aggregation on the tiny model: the advantages trained on are the ones the core
function gives for the rewards logged, a gated reward's None included."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from grpokit.config import GRPOKitConfig
from grpokit.core.advantages import compute_advantages, normalize_then_sum
from grpokit.train.trainer import GRPOTrainer

REWARDS = '''
def even(prompts, completions, **columns):
    """0/1 (about half of the tiny model's random texts pass): an even number of characters."""
    return [1.0 if len(c) % 2 == 0 else 0.0 for c in completions]


def length(prompts, completions, **columns):
    """A dense score on another scale: the completion's length in characters."""
    return [float(len(c)) for c in completions]
'''


def _rewards(tmp_path: Path, otherwise: float | None) -> list[dict[str, object]]:
    (tmp_path / "gdpo_rewards.py").write_text(REWARDS)
    return [
        {"type": "python", "name": "even", "function": "gdpo_rewards.py:even"},
        {
            "type": "python",
            "name": "length",
            "function": "gdpo_rewards.py:length",
            "weight": 0.5,
            # Scored only where the 0/1 reward passed; elsewhere `otherwise`.
            "gate": {"reward": "even", "min": 1.0, "otherwise": otherwise},
        },
    ]


@pytest.mark.parametrize("aggregation", ["normalize_then_sum", "sum_then_normalize"])
def test_logged_advantages_are_the_aggregations(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path, aggregation: str
) -> None:
    cfg = make_config(
        rewards=_rewards(tmp_path, otherwise=None),
        multi_objective_aggregation=aggregation,
        max_steps=3,
        max_completion_length=12,
        num_completions_to_print=8,  # the whole step: 2 prompts x 4
    )
    assert cfg.training.multi_objective_aggregation == aggregation
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
    result = trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.policy.model.named_parameters())
    rows = [json.loads(x) for x in (result.run_dir / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 8 + [2] * 8 + [3] * 8
    saw_none = False
    for step in (1, 2, 3):
        mine = [r for r in rows if r["step"] == step]
        nan = float("nan")
        per_function = torch.tensor(
            [[nan if r["rewards"][k] is None else r["rewards"][k] for k in ("even", "length")]
             for r in mine]
        )  # fmt: skip
        saw_none |= bool(torch.isnan(per_function).any())
        if aggregation == "normalize_then_sum":
            expected = normalize_then_sum(per_function, torch.tensor([1.0, 0.5]), 4)
        else:
            total = torch.tensor([nan if r["reward"] is None else r["reward"] for r in mine])
            expected = compute_advantages(total, 4)
        torch.testing.assert_close(torch.tensor([r["advantage"] for r in mine]), expected)
    assert saw_none, "every completion passed the gate: its None was not exercised"


def test_dynamic_sampling_keeps_a_group_whose_rewards_differ(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    """normalize_then_sum drops only groups in which every reward is flat."""
    cfg = make_config(
        rewards=_rewards(tmp_path, otherwise=0.0),
        multi_objective_aggregation="normalize_then_sum",
        dynamic_sampling=True,
        max_completion_length=12,
        max_steps=2,
    )
    result = GRPOTrainer(cfg, progress=False, log=lambda m: None).train()
    assert result.global_step == 2
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history)
