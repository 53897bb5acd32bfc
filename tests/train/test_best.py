"""The best checkpoint and early stopping, step by step on hand-made eval sequences; rotation
that keeps the best; trainer_state.json's best fields read back."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from grpokit.config import TrainingConfig
from grpokit.config.training import heldout_metric_name
from grpokit.models.manifest import CheckpointDamaged
from grpokit.train.best import is_better, record_checkpoint, record_eval, stops_early
from grpokit.train.checkpoint import TrainerState, read_trainer_state, rotate_checkpoints


def _evals(values: list[float], *, greater: bool = True, threshold: float = 0.0) -> TrainerState:
    state = TrainerState()
    for step, value in enumerate(values, start=1):
        record_eval(state, step, value, greater=greater, threshold=threshold)
    return state


def test_is_better() -> None:
    assert is_better(0.1, None, greater=True) and is_better(0.1, None, greater=False)
    assert is_better(0.5, 0.4, greater=True) and not is_better(0.4, 0.4, greater=True)
    assert is_better(0.3, 0.4, greater=False) and not is_better(0.5, 0.4, greater=False)
    assert not is_better(math.nan, None, greater=True)
    assert not is_better(math.nan, 0.1, greater=False)


def test_best_and_patience_hand_computed() -> None:
    # 0.2 best (counter 0), 0.9 best (0), 0.5 (1), 0.95 best (0), 0.3 (1), 0.1 (2).
    state = _evals([0.2, 0.9, 0.5, 0.95, 0.3, 0.1])
    assert (state.best_metric, state.best_global_step) == (0.95, 4)
    assert state.early_stopping_patience_counter == 2
    assert stops_early(state, 2) and not stops_early(state, 3) and not stops_early(state, None)


def test_threshold_counts_small_gains_as_no_improvement_but_records_them() -> None:
    # EarlyStoppingCallback: 0.52 beats 0.5 by 0.02 <= 0.05, so the counter goes up, and 0.52 is
    # still the best value (the next gain is measured from it); 0.53 likewise: counter 2.
    state = _evals([0.2, 0.5, 0.52, 0.53], threshold=0.05)
    assert (state.best_metric, state.best_global_step) == (0.53, 4)
    assert state.early_stopping_patience_counter == 2


def test_lower_is_better_and_nan_never_improves() -> None:
    state = _evals([3.0, 2.0, math.nan, 2.5], greater=False)
    assert (state.best_metric, state.best_global_step) == (2.0, 2)
    assert state.early_stopping_patience_counter == 2
    assert record_eval(TrainerState(), 1, math.nan, greater=True) is False


def test_best_checkpoint_is_the_best_of_the_saved_evals() -> None:
    # Evals at steps 1..6 with values (0.5, 0.9, 0.7, 0.6, 0.8, 0.4); checkpoints at 3 and 6
    # (save every 3). The best eval (step 2) was never saved: the best checkpoint is the best
    # saved one, step 3 (0.7). (transformers would name none: checkpoint-2 does not exist.)
    state = TrainerState()
    values = {1: 0.5, 2: 0.9, 3: 0.7, 4: 0.6, 5: 0.8, 6: 0.4}
    for step, value in values.items():
        record_eval(state, step, value, greater=True)
        if step % 3 == 0:
            record_checkpoint(state, step, value, greater=True)
    assert state.best_model_checkpoint == "checkpoint-3"
    assert state.best_model_checkpoint_metric == 0.7
    assert (state.best_metric, state.best_global_step) == (0.9, 2)
    # A checkpoint without an eval at its step (a time-based save) does not compete.
    assert record_checkpoint(state, 7, None, greater=True) is False
    assert record_checkpoint(state, 8, 0.75, greater=True) is True
    assert state.best_model_checkpoint == "checkpoint-8"


def _run_dir(tmp_path: Path, steps: list[int]) -> Path:
    for step in steps:
        (tmp_path / f"checkpoint-{step}").mkdir()
    return tmp_path


def _left(run: Path) -> list[str]:
    return sorted((p.name for p in run.glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))


@pytest.mark.parametrize(
    ("limit", "keep", "left"),
    [
        (2, None, ["checkpoint-4", "checkpoint-5"]),
        (2, "checkpoint-2", ["checkpoint-2", "checkpoint-5"]),
        # Limit 1 with a best that is not the latest: both stay (transformers' rule).
        (1, "checkpoint-2", ["checkpoint-2", "checkpoint-5"]),
        (1, "checkpoint-5", ["checkpoint-5"]),
        (3, "checkpoint-1", ["checkpoint-1", "checkpoint-4", "checkpoint-5"]),
        (None, "checkpoint-1", [f"checkpoint-{s}" for s in (1, 2, 3, 4, 5)]),
        # A best that is gone already protects nothing.
        (2, "checkpoint-9", ["checkpoint-4", "checkpoint-5"]),
    ],
)
def test_rotation_never_deletes_the_best_nor_the_latest(
    tmp_path: Path, limit: int | None, keep: str | None, left: list[str]
) -> None:
    run = _run_dir(tmp_path, [1, 2, 3, 4, 5])
    rotate_checkpoints(run, limit, keep=keep)
    assert _left(run) == left


V1 = {
    "global_step": 4,
    "epoch": 0,
    "position": 8,
    "generation_round": 4,
    "skipped_steps": 0,
    "nonfinite_streak": 0,
}


def test_trainer_state_without_best_fields_reads_as_none_recorded(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(V1))
    state = read_trainer_state(path)
    assert state.best_model_checkpoint is None and state.early_stopping_patience_counter == 0
    full = {
        **V1,
        "best_metric": 0.5,
        "best_global_step": 2,
        "best_model_checkpoint": "checkpoint-2",
        "best_model_checkpoint_metric": 0.5,
        "early_stopping_patience_counter": 1,
    }
    path.write_text(json.dumps(full))
    assert read_trainer_state(path) == TrainerState(**full)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"best_metric": "high"}, "field 'best_metric' is 'high'; expected a finite number"),
        ({"best_metric": True}, "field 'best_metric' is True"),
        ({"best_global_step": -1}, "field 'best_global_step' is -1; expected a whole number"),
        ({"best_model_checkpoint": "../elsewhere"}, "expected a checkpoint-<step> directory name"),
        ({"early_stopping_patience_counter": None}, "'early_stopping_patience_counter' is None"),
    ],
)
def test_damaged_best_fields_are_named(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({**V1, **change}))
    with pytest.raises(CheckpointDamaged, match=message):
        read_trainer_state(path)


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("eval_reward", "eval/reward"),
        ("reward", "eval/reward"),
        ("eval_rewards/format/mean", "eval/format/mean"),
        ("rewards/checklist/mean", "eval/checklist/mean"),
        ("eval/format/pass_rate", "eval/format/pass_rate"),
        ("eval/checklist/price/pass_rate", "eval/checklist/price/pass_rate"),
    ],
)
def test_trl_and_grpokit_metric_names(given: str, name: str) -> None:
    assert heldout_metric_name(given) == name
    assert TrainingConfig(metric_for_best_model=given, eval_steps=5).best_metric == name


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("eval_loss", "it computes no loss"),
        ("loss", "it computes no loss"),
        ("eval_reward_std", "does not log it"),
        ("eval/", "does not log it"),
    ],
)
def test_metric_names_the_eval_does_not_log_are_refused(given: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        heldout_metric_name(given)


def test_best_metric_defaults_and_direction() -> None:
    assert TrainingConfig().best_metric is None
    assert TrainingConfig(load_best_model_at_end=True, eval_steps=5, save_steps=10).best_metric == (
        "eval/reward"
    )
    assert TrainingConfig(early_stopping_patience=3, eval_steps=5).best_metric == "eval/reward"
    assert TrainingConfig(save_strategy="best", eval_steps=5).save_interval(7) == 0
    assert TrainingConfig().best_is_greater
    assert not TrainingConfig(greater_is_better=False).best_is_greater


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"load_best_model_at_end": True}, "load_best_model_at_end needs the periodic held-out"),
        ({"save_strategy": "best"}, "save_strategy: best needs the periodic held-out eval"),
        ({"early_stopping_patience": 2}, "early_stopping_patience needs the periodic held-out"),
        (
            {"load_best_model_at_end": True, "eval_steps": 4, "save_steps": 6},
            "save_steps 6 is not a multiple of eval_steps 4",
        ),
        (
            {"load_best_model_at_end": True, "eval_steps": 4, "save_strategy": "epoch"},
            "epochs end where the eval may not fall",
        ),
    ],
)
def test_settings_that_cannot_keep_a_best_checkpoint_are_refused(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TrainingConfig(**settings)
