"""The business-ideas recipe's checklist configs (the seed's five criteria as five yes/no items),
and the English one's questions asked of the real llama.cpp server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit.config import load_config
from grpokit.recipes import recipe_dir
from grpokit.rewards import BuildContext, build_reward_set
from grpokit.rewards.builtin.checklist import ChecklistParams
from grpokit.rewards.spec import parse_reward_specs

from .conftest import LLAMA_MODEL_ALIAS, LlamaServer

RECIPE = recipe_dir("business-ideas")
ITEMS = ["revenue_model", "customer", "product", "kpi", "advantage"]


@pytest.mark.parametrize(
    ("name", "yes"), [("config.checklist.yaml", "はい"), ("config.checklist.en.yaml", "yes")]
)
def test_checklist_configs_hold_the_five_criteria(name: str, yes: str) -> None:
    config = load_config(RECIPE / name)
    assert [r.display_name for r in config.rewards] == ["xml_format", "quality"]
    quality = config.rewards[1]
    assert quality.type == "checklist"
    assert quality.gate is not None and quality.gate.reward == "xml_format"
    params = quality.params
    assert isinstance(params, ChecklistParams)
    assert [item.name for item in params.items] == ITEMS
    assert all(item.weight == 1.0 for item in params.items)
    for item in params.items:
        assert item.question is not None and item.question.count("{completion}") == 1
        assert yes in item.question
    # Beside the additive rubric: everything but the quality reward is config.yaml's.
    additive = load_config(RECIPE / name.replace("checklist.", ""))
    assert config.model_dump(exclude={"rewards"}) == additive.model_dump(exclude={"rewards"})
    assert config.rewards[0] == additive.rewards[0]


def test_english_checklist_on_the_real_judge(llama_server: LlamaServer, tmp_path: Path) -> None:
    config = load_config(RECIPE / "config.checklist.en.yaml")
    raw = config.rewards[1].model_dump(exclude_none=True)
    raw["judges"] = [
        {"backend": "openai", "base_url": llama_server.base_url, "model": LLAMA_MODEL_ALIAS,
         "max_tokens": 2}
    ]  # fmt: skip
    raw.pop("gate")
    first = json.loads((RECIPE / "audit_en.jsonl").read_text(encoding="utf-8").splitlines()[0])
    completions = [first["completion"], "<thinking>\n</thinking>\n<proposal>\n</proposal>"]
    specs = parse_reward_specs([raw])
    with build_reward_set(specs, BuildContext(base_dir=RECIPE, run_dir=tmp_path)) as rewards:
        scores = rewards([first["prompt"]] * 2, completions, {})
    for item in ITEMS:
        values = scores.parts[f"checklist/{item}"].tolist()
        assert all(0.0 <= v <= 1.0 for v in values), (item, values)
        assert scores.metrics[f"judge/{item}/expected_fallback_rate"] == 0.0
        assert f"checklist/{item}/pass_rate" in scores.metrics
    total = scores.column("quality")
    assert all(t is not None and 0.0 <= t <= 1.0 for t in total)
