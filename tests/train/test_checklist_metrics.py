"""A checklist reward's item pass rates reach the run's metrics: every step
(checklist/<item>/pass_rate), on held-out prompts (eval/checklist/<item>/pass_rate), and in the
forecast logged at the first step, which the end of the run holds against the held-out rate."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from grpokit.config import GRPOKitConfig
from grpokit.core.forecast import forecast_for_reward
from grpokit.train.step_metrics import forecast_metrics, forecast_summary, heldout_hint
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
    lines: list[str] = []
    result = GRPOTrainer(cfg, progress=False, log=lines.append).train()
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
    # The forecast from each item's first-step rate, and the end-of-run lines beside held-out.
    for item in ("has_e", "any_text"):
        start = row[f"checklist/{item}/pass_rate"]
        want = forecast_for_reward(start, beta=cfg.training.beta, std_normalized=True)
        assert row[f"forecast/checklist/{item}/pass_rate"] == pytest.approx(want)
        held = row[f"eval/checklist/{item}/pass_rate"]
        assert (
            f"  checklist/{item}: pass rate {start:.0%} at the start, forecast {want:.0%}; "
            f"held out {held:.0%} -> {held:.0%} (step 1)" in lines
        )
    # A header, then the reward itself and its two items.
    assert lines[-4].startswith("forecast (the KL-regularised optimum")
    assert lines[-3].startswith("  checklist: pass rate ")


def test_forecast_metrics_for_parts_and_the_summary() -> None:
    metrics = {"pass_rate/quality": 0.5, "checklist/price/pass_rate": 0.25,
               "checklist/kpi/pass_rate": float("nan")}  # fmt: skip
    out = forecast_metrics(
        metrics, ["quality"], beta=0.04, scale_rewards="group",
        part_names=["checklist/price", "checklist/kpi"],
    )  # fmt: skip
    assert out == {
        "forecast/quality/pass_rate": forecast_for_reward(0.5, beta=0.04, std_normalized=True),
        "forecast/checklist/price/pass_rate": forecast_for_reward(
            0.25, beta=0.04, std_normalized=True
        ),
    }
    lines = forecast_summary([{"step": 1, **metrics, **out}], no_heldout="set data.heldout")
    assert lines[1].endswith("; no held-out check logged (set data.heldout)")
    assert lines[2].startswith("  checklist/price: pass rate 25% at the start, forecast ")
    assert forecast_summary([{"reward": 1.0}], no_heldout="") == []


def test_the_heldout_hint_names_only_what_is_missing_or_wrong() -> None:
    def hint(heldout: bool, eval_steps: int | None, interval: int) -> str:
        return heldout_hint(heldout=heldout, eval_steps=eval_steps, eval_interval=interval, steps=3)

    assert hint(False, None, 0) == "set data.heldout and training.eval_steps"
    assert hint(False, 2, 2) == "set data.heldout"
    assert hint(True, None, 0) == "set training.eval_steps"
    assert hint(True, 5, 5) == (
        "the held-out eval runs every 5 steps (training.eval_steps), more than the run's 3: "
        "set training.eval_steps to at most 3"
    )
    # eval_strategy: steps without eval_steps: logging_steps sets the interval.
    assert "(training.logging_steps, eval_steps' default)" in hint(True, None, 10)
