"""A short real run of the hackable logic-tree recipe on the embedded model (slow: minutes).

Checks that the trainer feeds the monitors (text metrics on every step), that the alerts it
recorded are exactly what the monitors give when replayed over its metrics.jsonl, and that the
report of the run builds. Whether the model hacks the depth reward in so few steps is reported in
the run's numbers, not asserted: on a 2-core CPU the base model wrote no tree at all in its first
samples (reward 0 for all 8, frac_reward_zero_std 1.0), so there was nothing to amplify.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit.config import load_config
from grpokit.evaluate.report import build_report
from grpokit.monitor import MonitorSet
from grpokit.recipes import recipe_dir
from grpokit.rewards.compose import build_reward_set
from grpokit.rewards.registry import BuildContext
from grpokit.train.trainer import GRPOTrainer

RECIPE = recipe_dir("logic-tree")
STEPS = 3


@pytest.mark.slow
def test_hackable_recipe_short_run_monitors_and_report(tmp_path: Path) -> None:
    cfg = load_config(
        RECIPE / "config.hackable.yaml",
        [
            f"training.max_steps={STEPS}",
            "training.max_completion_length=48",
            "training.eval_steps=0",
        ],
    )
    run_dir = tmp_path / "hackable"
    trainer = GRPOTrainer(cfg, run_dir=run_dir, progress=False, log=lambda _: None)
    try:
        trainer.train()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        for key in ("completions/repeated_ngram_frac", "completions/distinct_2",
                    "completions/max_group_duplicate_frac", "rewards/logic_tree_depth/mean"):  # fmt: skip
            assert isinstance(r[key], float)
    rewards = build_reward_set(cfg.rewards, BuildContext(base_dir=RECIPE))
    tops = {n: m for n, m in zip(rewards.names, rewards.max_values, strict=True) if m is not None}
    replay = MonitorSet(cfg.monitors, rewards.names, tops)
    replayed = [a.to_dict() for r in rows for a in replay.update(r["step"], r)]
    recorded = [a for r in rows for a in r.get("alerts", [])]
    assert recorded == replayed
    html = build_report(run_dir).read_text(encoding="utf-8")
    assert '<section id="samples">' in html
    assert len(list((run_dir / "report").glob("*.png"))) >= 4
