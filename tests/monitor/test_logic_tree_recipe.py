"""The logic-tree recipe: configs load, and its rewards and monitors judge the seed's two trees."""

from __future__ import annotations

import json

import pytest

from grpokit.config import load_config
from grpokit.data.prompts import load_prompts
from grpokit.monitor import MonitorConfig, MonitorSet, text_stats
from grpokit.recipes import recipe_dir
from grpokit.rewards.compose import build_reward_set
from grpokit.rewards.registry import BuildContext

RECIPE = recipe_dir("logic-tree")
EXAMPLES = json.loads((RECIPE / "seed_examples_ja.json").read_text(encoding="utf-8"))


def _score(config: str, texts: list[str]) -> list[float]:
    cfg = load_config(RECIPE / config)
    rewards = build_reward_set(cfg.rewards, BuildContext(base_dir=RECIPE))
    scores = rewards([EXAMPLES["prompt"]] * len(texts), texts, {})
    return [float(x) for x in scores.total]


@pytest.mark.parametrize(
    ("config", "heldout"),
    [
        ("config.hackable.yaml", 4),
        ("config.guarded.yaml", 4),
        ("config.hackable.en.yaml", 8),
        ("config.guarded.en.yaml", 8),
    ],
)
def test_recipe_configs_and_data_load(config: str, heldout: int) -> None:
    cfg = load_config(RECIPE / config)
    train = load_prompts(cfg.resolve(cfg.data.train))
    assert len(train) == 12
    assert cfg.data.heldout is not None
    held = load_prompts(cfg.resolve(cfg.data.heldout))
    assert len(held) == heldout
    assert not {r.prompt for r in train} & {r.prompt for r in held}
    assert cfg.system_prompt is not None and "├─ / └─ / │" in cfg.system_prompt
    assert cfg.training.prompts_per_step == 2
    # Both runs log the raw depth and the quality signal; the quality is watched, not trained on.
    weights = {spec.display_name: spec.weight for spec in cfg.rewards}
    assert weights["logic_tree_quality"] == 0
    assert "logic_tree_depth" in weights
    assert cfg.monitors.heldout.watch == ["logic_tree_quality"]


def test_english_demonstrations_are_trees_for_training_prompts_only() -> None:
    demos = [json.loads(line) for line in (RECIPE / "demos_en.jsonl").read_text().splitlines()]
    train = {r.prompt for r in load_prompts(RECIPE / "train_en.jsonl")}
    assert {d["prompt"] for d in demos} == train  # two trees for each, none for held-out prompts
    assert len(demos) == 2 * len(train)
    rewards = build_reward_set(
        load_config(RECIPE / "config.guarded.en.yaml").rewards, BuildContext(base_dir=RECIPE)
    )
    scores = rewards([d["prompt"] for d in demos], [d["completion"] for d in demos], {})
    # Depth 2 or 3 (room to grow), no repetition, every line a distinct branch.
    assert set(scores.column("logic_tree_depth")) == {2.0, 3.0}
    assert set(scores.column("repetition_penalty")) == {0.0}
    assert set(scores.column("logic_tree_quality")) == {1.0}


def test_hackable_reward_prefers_the_hacked_tree_and_guarded_does_not() -> None:
    base, hacked = EXAMPLES["base"], EXAMPLES["hacked"]
    assert _score("config.hackable.yaml", [base, hacked]) == [6.0, 7.0]
    guarded = _score("config.guarded.yaml", [base, hacked])
    assert guarded[0] == pytest.approx(1.0)
    # Guarded depth 1 of 5 (only the first branch is well formed), minus the repetition penalty.
    assert guarded[1] == pytest.approx(0.2 - 0.6242, abs=1e-3)


def test_repetition_monitor_fires_when_samples_turn_into_the_hacked_tree() -> None:
    monitors = MonitorSet(MonitorConfig(), ["logic_tree_depth"])
    alerts = []
    for step in range(1, 13):
        texts = [EXAMPLES["base"]] * 4 if step <= 6 else [EXAMPLES["hacked"]] * 4
        alerts += monitors.update(step, text_stats(texts, group_size=4))
    rules = {(a.rule, a.step) for a in alerts}
    # repeated 3-gram share 0.07 -> 0.43: fires once the 3-step mean has moved by 0.15
    assert ("repetition", 8) in rules
