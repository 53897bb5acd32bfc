"""The best checkpoint on the tiny model: a held-out reward scripted per eval (values exact in float32) makes the best step
known; rotation keeps it, early stopping stops, resume goes on, export --best picks it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file

from grpokit.config import GRPOKitConfig
from grpokit.errors import UserError
from grpokit.models.checkpoints import best_checkpoint, resolve_model
from grpokit.train.run import resume_run
from grpokit.train.trainer import GRPOTrainer

SCRIPTED = '''
SCRIPT = {script}
calls = []


def scripted(prompts, completions, **columns):
    """On the held-out prompts ("Tell me about ..."), the next value of SCRIPT, one per eval;
    on the training prompts, the share of the letter e."""
    if all(p.startswith("Tell me") for p in prompts):
        calls.append(None)
        return [SCRIPT[len(calls) - 1]] * len(completions)
    return [c.count("e") / max(1, len(c)) for c in completions]
'''


def _config(
    make_config: Callable[..., GRPOKitConfig],
    tmp_path: Path,
    script: list[float],
    **training: Any,
) -> GRPOKitConfig:
    (tmp_path / "scripted.py").write_text(SCRIPTED.format(script=script))
    reward = {"type": "python", "name": "scripted", "function": "scripted.py:scripted"}
    return make_config(rewards=[reward], eval_steps=1, eval_max_prompts=2, **training)


def _state(run: Path, step: int) -> dict[str, Any]:
    return json.loads((run / f"checkpoint-{step}" / "trainer_state.json").read_text())


def _checkpoints(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*"))


def test_rotation_keeps_the_best_and_export_best_picks_it(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    cfg = _config(
        make_config,
        tmp_path,
        [0.25, 0.875, 0.5, 0.375, 0.3125],
        max_steps=5,
        save_steps=1,
        save_total_limit=1,
        metric_for_best_model="eval_rewards/scripted/mean",  # TRL's name
        load_best_model_at_end=True,
    )
    lines: list[str] = []
    result = GRPOTrainer(cfg, progress=False, log=lines.append).train()
    run = result.run_dir
    assert [r["eval/scripted/mean"] for r in result.history] == [0.25, 0.875, 0.5, 0.375, 0.3125]
    # save_total_limit 1: the latest (to resume) and the best.
    assert _checkpoints(run) == [2, 5]
    state = _state(run, 5)
    assert state["best_model_checkpoint"] == "checkpoint-2"
    assert (state["best_metric"], state["best_global_step"]) == (0.875, 2)
    assert state["best_model_checkpoint_metric"] == 0.875
    assert result.checkpoint == run / "checkpoint-2"  # load_best_model_at_end
    assert any(x.startswith(f"best checkpoint: {run / 'checkpoint-2'}") for x in lines)
    # The run directory means its best checkpoint (load_best_model_at_end), --best or not.
    assert best_checkpoint(run) == run / "checkpoint-2"
    assert resolve_model(str(run)).label == f"{run.name}/checkpoint-2"
    assert resolve_model(str(run), best=True).label == f"{run.name}/checkpoint-2"

    from grpokit.models.cli import export_cmd

    out = tmp_path / "best-hf"
    done = CliRunner().invoke(
        export_cmd, [str(run), "--best", "--format", "hf", "--out", str(out), "--check", "0"]
    )
    assert done.exit_code == 0, done.output
    assert f"the run's best checkpoint: {run / 'checkpoint-2'}" in done.output
    exported = load_file(str(out / "model.safetensors"))
    saved = load_file(str(run / "checkpoint-2" / "model" / "model.safetensors"))
    latest = load_file(str(run / "checkpoint-5" / "model" / "model.safetensors"))
    name = next(n for n in saved if "q_proj" in n)
    assert exported[name].equal(saved[name]) and not exported[name].equal(latest[name])


def test_without_load_best_the_run_directory_means_its_latest(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    cfg = _config(
        make_config,
        tmp_path,
        [0.25, 0.875, 0.5],
        max_steps=3,
        save_steps=1,
        metric_for_best_model="eval/reward",
    )
    result = GRPOTrainer(cfg, progress=False, log=lambda m: None).train()
    run = result.run_dir
    assert result.checkpoint == run / "checkpoint-3"
    assert resolve_model(str(run)).label == f"{run.name}/checkpoint-3"
    assert resolve_model(str(run), best=True).label == f"{run.name}/checkpoint-2"
    with pytest.raises(UserError, match="--best takes a run directory"):
        resolve_model(str(run / "checkpoint-3"), best=True)


def test_early_stopping_stops_after_patience_evals_without_improvement(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    # 0.25, 0.875 (best), 0.5, 0.375: two evals without improvement at step 4.
    cfg = _config(
        make_config,
        tmp_path,
        [0.25, 0.875, 0.5, 0.375, 0.9375, 0.96875, 0.96875, 0.96875],
        max_steps=8,
        save_steps=2,
        early_stopping_patience=2,
    )
    lines: list[str] = []
    result = GRPOTrainer(cfg, progress=False, log=lines.append).train()
    assert result.global_step == 4
    assert [r["step"] for r in result.history] == [1, 2, 3, 4]
    assert _checkpoints(result.run_dir) == [2, 4]
    assert any(
        x.startswith("early stopping at step 4: eval/reward has not improved for 2 evaluation")
        and "(best 0.875 at step 2)" in x
        for x in lines
    )
    assert _state(result.run_dir, 4)["best_model_checkpoint"] == "checkpoint-2"


def test_save_strategy_best_saves_at_each_new_best(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    cfg = _config(
        make_config,
        tmp_path,
        [0.25, 0.875, 0.5, 0.9375, 0.3125],
        max_steps=5,
        save_strategy="best",
        save_minutes=0,
    )
    result = GRPOTrainer(cfg, progress=False, log=lambda m: None).train()
    assert _checkpoints(result.run_dir) == [1, 2, 4, 5]  # the new bests, and the final one
    assert _state(result.run_dir, 5)["best_model_checkpoint"] == "checkpoint-4"


def test_resume_keeps_the_best_and_the_patience_count(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    # 0.875 (best) at step 1, then 0.5 and 0.375: the run stops (as killed) after step 2's
    # checkpoint with one eval without improvement; resumed, step 3's 0.375 is the second.
    cfg = _config(
        make_config,
        tmp_path,
        [0.875, 0.5, 0.375, 0.3125, 0.25],
        max_steps=5,
        save_steps=1,
        save_total_limit=1,
        early_stopping_patience=2,
    )
    first = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    first.total_steps = 2
    first.train()
    assert _state(cfg.output_dir, 2)["early_stopping_patience_counter"] == 1
    resumed = resume_run(cfg.output_dir, progress=False)
    assert resumed.global_step == 3
    assert _checkpoints(cfg.output_dir) == [1, 3]
    assert _state(cfg.output_dir, 3)["best_model_checkpoint"] == "checkpoint-1"


def test_a_metric_the_eval_does_not_log_stops_before_the_model_loads(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    cfg = _config(make_config, tmp_path, [0.5], metric_for_best_model="eval/scripted/pass_rate")
    with pytest.raises(UserError, match="does not log eval/scripted/pass_rate; it logs"):
        GRPOTrainer(cfg, progress=False, log=lambda m: None)
    with pytest.raises(UserError, match="names 'nothing', not a reward of this config"):
        _config(make_config, tmp_path, [0.5], metric_for_best_model="eval_rewards/nothing/mean")
