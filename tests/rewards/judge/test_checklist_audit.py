"""The checklist item audit (grpokit judge audit-checklist) and the business-ideas recipe's
program items, on the recipe's labelled answers."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpokit.config import load_config
from grpokit.errors import UserError
from grpokit.recipes import recipe_dir
from grpokit.rewards.audit.checklist import item_audit, sign_test
from grpokit.rewards.builtin.checklist import ChecklistParams
from grpokit.rewards.judge.cli import judge_cli

RECIPE = recipe_dir("business-ideas")
PROGRAM_ITEMS = ["price_stated", "target_named", "kpi_number"]


def recipe_checks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("business_checks", RECIPE / "checks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sign_test_by_hand() -> None:
    assert sign_test(8, 0) == pytest.approx(1 / 256)
    assert sign_test(7, 1) == pytest.approx(9 / 256)  # 8 choose 7 + 8 choose 8
    assert sign_test(0, 3) == 1.0
    assert math.isnan(sign_test(0, 0))


def test_item_audit_by_hand() -> None:
    rows: list[dict[str, Any]] = [
        {"prompt": "a", "fails": []},
        {"prompt": "a", "fails": ["kpi"]},
        {"prompt": "a", "fails": ["price"]},
        {"prompt": "b", "fails": []},
        {"prompt": "b", "fails": ["kpi"]},
    ]
    audit = item_audit("kpi", "question", rows, [0.6, 0.2, 0.5, 0.3, 0.3])
    assert (audit.meets, audit.fails) == (3, 2)
    assert audit.meets_mean == pytest.approx((0.6 + 0.5 + 0.3) / 3)
    assert audit.fails_mean == pytest.approx(0.25)
    # (meets, fails) pairs in the right order: 0.6 and 0.5 beat both, 0.3 beats 0.2, ties 0.3.
    assert audit.separation == pytest.approx((2 + 2 + 1.5) / 6)
    # Paired with their good originals: a 0.6 > 0.2 (win), b 0.3 = 0.3 (tie, left out).
    assert (audit.pairs, audit.paired_wins) == (2, 0.75)
    assert audit.p_value == 0.5 and audit.verdict == "no better than chance"
    none = item_audit("kpi", "question", rows, [None] * 5)
    assert none.pairs == 0 and none.verdict == "no pairs"


@pytest.mark.parametrize(
    ("prompt", "completion", "expected"),
    [
        ("Target: operators in logistics warehouses. Technology: AGVs.",
         "Sold to operators of logistics warehouses.", 1.0),
        ("Target: operators in logistics warehouses. Technology: AGVs.",
         "A robot that moves shelves.", 0.0),
        ("ターゲット：中小製造業の保全担当。技術：IoT。", "顧客: 中小製造業の保全担当者。", 1.0),
        ("ターゲット：中小製造業の保全担当。技術：IoT。", "顧客: 大企業の経営者。", 0.0),
        ("Propose anything.", "Anything.", None),
    ],
)  # fmt: skip
def test_target_named(prompt: str, completion: str, expected: float | None) -> None:
    checks = recipe_checks()
    assert checks.target_named([prompt], [completion]) == [expected]


def _program_config(tmp_path: Path, lang: str) -> Path:
    """The program items of the recipe's program checklist, without the judge questions."""
    name = "config.checklist.program.en.yaml" if lang == "en" else "config.checklist.program.yaml"
    params = load_config(RECIPE / name).rewards[1].params
    assert isinstance(params, ChecklistParams)
    items = [
        item.model_dump(exclude_none=True, exclude_defaults=True)
        for item in params.items
        if item.question is None
    ]
    for item in items:
        if "function" in item:
            item["function"] = f"{RECIPE / 'checks.py'}:target_named"
    config = {
        "data": {"train": str(RECIPE / f"train_{lang}.jsonl")},
        "rewards": [{"type": "checklist", "items": items}],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return path


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_recipe_program_items_on_the_labelled_answers(tmp_path: Path, lang: str) -> None:
    config = _program_config(tmp_path, lang)
    labelled = RECIPE / f"audit_items_{lang}.jsonl"
    output = tmp_path / "report.json"
    result = CliRunner().invoke(
        judge_cli,
        ["audit-checklist", str(config), "--completions", str(labelled), "--output", str(output)],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(output.read_text(encoding="utf-8"))
    assert report["answers"] == 48  # 8 good answers, each with 5 variants failing one item
    by_item = {a["item"]: a for a in report["items"]}
    assert list(by_item) == PROGRAM_ITEMS
    for item in PROGRAM_ITEMS:
        audit = by_item[item]
        # Each program item is right on every labelled answer.
        assert (audit["meets_mean"], audit["fails_mean"]) == (1.0, 0.0), item
        assert (audit["meets"], audit["fails"], audit["pairs"]) == (40, 8, 8)
        assert audit["separation"] == 1.0 and audit["paired_wins"] == 1.0
        assert audit["p_value"] == pytest.approx(1 / 256)
        assert audit["verdict"] == "better than chance"
    assert "one-sided sign test on the paired answers" in result.output


def test_audit_checklist_errors(tmp_path: Path) -> None:
    config = _program_config(tmp_path, "en")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "p", "completion": "c"}\n', encoding="utf-8")
    from grpokit.rewards.audit.checklist import audit_checklist

    cfg = load_config(config)
    with pytest.raises(UserError, match="row 1: no `fails` list"):
        audit_checklist(cfg.rewards, cfg.config_dir, rows, source="c")
    rows.write_text('{"prompt": "p", "completion": "c", "fails": ["prise"]}\n', encoding="utf-8")
    with pytest.raises(UserError, match="no row's `fails` names an item .* the rows name: prise"):
        audit_checklist(cfg.rewards, cfg.config_dir, rows, source="c")
