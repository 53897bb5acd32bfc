"""Every shipped recipe config loads, and its data files and rewards line up."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpokit.config import load_config
from grpokit.data import check_columns, load_prompts
from grpokit.recipes import RECIPES_DIR
from grpokit.rewards import BuildContext, build_reward_set

RECIPES = sorted(RECIPES_DIR.glob("*/config*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[f"{p.parent.name}/{p.name}" for p in RECIPES])
def test_recipe_config_loads_with_its_data(path: Path) -> None:
    cfg = load_config(path)
    rows = load_prompts(cfg.resolve(cfg.data.train))
    assert rows and cfg.system_prompt
    if cfg.data.heldout:
        heldout = load_prompts(cfg.resolve(cfg.data.heldout))
        assert not {str(r.prompt) for r in rows} & {str(r.prompt) for r in heldout}
    served = [
        judge
        for spec in cfg.rewards
        for judge in getattr(spec.params, "judges", None) or []
        if judge.backend != "local"
    ]
    if served or any(spec.type == "judge" for spec in cfg.rewards):
        # Building a judge contacts (or, llama_server, starts) its backend, whose model a fresh
        # `make test` does not install: covered by tests/rewards/judge and the slow recipe test.
        return
    with build_reward_set(cfg.rewards, BuildContext(base_dir=cfg.config_dir)) as rewards:
        check_columns(rows, rewards.required_columns, str(cfg.data.train))


def test_there_are_recipes() -> None:
    assert {p.parent.name for p in RECIPES} >= {"arithmetic", "business-ideas", "logic-tree"}
