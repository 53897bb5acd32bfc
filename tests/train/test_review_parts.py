"""A checklist's item scores reach the samples `grpokit review` reads: completions.jsonl of a
real (tiny) run and of `grpokit eval`, and the items to grade come from the run's config."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from grpokit.config import GRPOKitConfig
from grpokit.evaluate.eval import run_eval
from grpokit.evaluate.review_data import checklist_items, find_samples
from grpokit.train.trainer import GRPOTrainer

ITEMS = [{"name": "has_e", "regex": "e"}, {"name": "short", "max_chars": 12, "weight": 2.0}]


def _check_parts(row: dict[str, object]) -> None:
    parts = row["parts"]
    assert isinstance(parts, dict) and isinstance(row["completion"], str)
    text = row["completion"]
    assert parts["checklist/has_e"] == (1.0 if re.search("e", text) else 0.0)
    assert parts["checklist/short"] == (1.0 if len(text.strip()) <= 12 else 0.0)


def test_item_scores_in_run_and_eval_samples(
    make_config: Callable[..., GRPOKitConfig], tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = make_config(rewards=[{"type": "checklist", "items": ITEMS}], max_steps=1)
    result = GRPOTrainer(cfg, progress=False).train()
    lines = (result.run_dir / "completions.jsonl").read_text(encoding="utf-8").splitlines()
    assert lines
    for line in lines:
        _check_parts(json.loads(line))
    found = find_samples(result.run_dir)
    assert found.kind == "run"
    items = checklist_items(found.config)
    assert [(i.name, i.weight) for i in items] == [("has_e", 1.0), ("short", 2.0)]
    assert {"checklist/has_e", "checklist/short", "checklist"} <= set(found.samples[0].scores)

    out = tmp_path / "eval"
    run_eval([str(tiny_model_dir)], tmp_path / "heldout.jsonl", samples=2, out_dir=out,
             config=tmp_path / "config.yaml", log=lambda _: None)  # fmt: skip
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        _check_parts(row)
    assert find_samples(out).kind == "eval"
