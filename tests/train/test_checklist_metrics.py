"""A checklist reward's item pass rates reach the run's metrics: every step
(checklist/<item>/pass_rate) and on held-out prompts (eval/checklist/<item>/pass_rate)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from grpokit.config import GRPOKitConfig
from grpokit.train.trainer import GRPOTrainer


def test_item_pass_rates_in_training_and_heldout_metrics(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    rewards = [
        {
            "type": "checklist",
            "items": [
                {"name": "has_e", "regex": "e"},
                {"name": "any_text", "min_chars": 1, "weight": 0.5},
            ],
        }
    ]
    cfg = make_config(rewards=rewards, max_steps=1, eval_steps=1, eval_samples=2)
    result = GRPOTrainer(cfg, progress=False, log=lambda m: None).train()
    row = result.history[0]
    for item in ("has_e", "any_text"):
        assert 0.0 <= row[f"checklist/{item}/pass_rate"] <= 1.0
        assert 0.0 <= row[f"eval/checklist/{item}/pass_rate"] <= 1.0
    # The reward is the items' weighted mean, so its mean lies between theirs.
    low, high = sorted(row[f"checklist/{i}/pass_rate"] for i in ("has_e", "any_text"))
    assert low - 1e-6 <= row["rewards/checklist/mean"] <= high + 1e-6
    assert row["rewards/checklist/mean"] == pytest.approx(
        (row["checklist/has_e/pass_rate"] + 0.5 * row["checklist/any_text/pass_rate"]) / 1.5
    )
