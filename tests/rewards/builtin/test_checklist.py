"""The checklist reward's program items on hand-made completions, its gates (on items, on other
rewards, on the whole), its item metrics in a reward set, and its bad inputs."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from grpokit.errors import UserError
from grpokit.rewards import BuildContext, RewardSpec, build_reward_set
from grpokit.rewards.builtin.checklist import weighted_mean
from grpokit.rewards.spec import parse_reward_specs

PRICE = {"name": "price", "regex": r"(?i)(\$|USD|yen|円)\s*\d|\d+\s*(USD|yen|円)"}
SHORT = {"name": "not_too_long", "max_chars": 60}
LONG_ENOUGH = {"name": "substantial", "min_chars": 20, "weight": 2.0}
JSON_ITEM = {
    "name": "kpi_json",
    "json_schema": {
        "type": "object",
        "required": ["kpi"],
        "properties": {"kpi": {"type": "string"}},
    },
}
COMPLETIONS = [
    "A meal box for 30 USD a week.",  # price, short, substantial
    "An app.",  # no price, short, not substantial
    'Plan {"kpi": "weekly active users"} and a fee of $5 per month for every single user.',
]


def build(items: list[dict[str, Any]], tmp_path: Path, **extra: Any) -> Any:
    specs = parse_reward_specs([{"type": "checklist", "items": items, **extra}])
    return build_reward_set(specs, BuildContext(base_dir=tmp_path))


def test_program_items_score_hand_made_completions(tmp_path: Path) -> None:
    items = [PRICE, SHORT, LONG_ENOUGH, JSON_ITEM]
    with build(items, tmp_path) as rewards:
        scores = rewards(["p"] * 3, COMPLETIONS, {})
    parts = {name: column.tolist() for name, column in scores.parts.items()}
    assert parts == {
        "checklist/price": [1.0, 0.0, 1.0],
        "checklist/not_too_long": [1.0, 1.0, 0.0],
        "checklist/substantial": [1.0, 0.0, 1.0],
        "checklist/kpi_json": [0.0, 0.0, 1.0],
    }
    # Weighted mean: weights 1, 1, 2, 1 (sum 5).
    want = [(1 + 1 + 2 + 0) / 5, (0 + 1 + 0 + 0) / 5, (1 + 0 + 2 + 1) / 5]
    assert scores.column("checklist") == pytest.approx(want)
    assert scores.metrics["checklist/price/pass_rate"] == pytest.approx(2 / 3)
    assert scores.metrics["checklist/kpi_json/pass_rate"] == pytest.approx(1 / 3)


def test_function_item_reads_a_column_and_its_range_is_checked(tmp_path: Path) -> None:
    (tmp_path / "checks.py").write_text(
        textwrap.dedent(
            """
            def names_target(prompts, completions, target, **columns):
                return [1.0 if t.lower() in c.lower() else 0.0 for c, t in zip(completions, target)]

            def out_of_range(prompts, completions, **columns):
                return [2.0] * len(completions)
            """
        )
    )
    item = {"name": "target", "function": "checks.py:names_target", "columns": ["target"]}
    with build([item], tmp_path) as rewards:
        assert rewards.required_columns == {"target"}
        scores = rewards(
            ["p", "p"], ["For nurses: ...", "For everyone."], {"target": ["nurses", "nurses"]}
        )
    assert scores.parts["checklist/target"].tolist() == [1.0, 0.0]
    bad = {"name": "bad", "function": "checks.py:out_of_range"}
    with build([bad], tmp_path) as rewards, pytest.raises(Exception, match=r"in \[0, 1\]"):
        rewards(["p"], ["x"], {})


def test_item_gates_on_items_and_on_other_rewards(tmp_path: Path) -> None:
    raw = [
        {"type": "xml_format", "tags": ["proposal"]},
        {
            "type": "checklist",
            "items": [
                {**PRICE, "gate": {"reward": "xml_format", "min": 1.0}},
                # Checked only where the price item passed; elsewhere "not applicable".
                {**SHORT, "gate": {"reward": "price", "min": 1.0, "otherwise": None}},
            ],
        },
    ]
    specs = parse_reward_specs(raw)
    assert specs[1].depends_on == ["xml_format"]
    completions = [
        "<proposal>\nA box for 30 USD.\n</proposal>",
        "A box for 30 USD.",  # no tags: the price item's gate stays closed
        "<proposal>\nA box, free.\n</proposal>",
    ]
    with build_reward_set(specs, BuildContext(base_dir=tmp_path)) as rewards:
        scores = rewards(["p"] * 3, completions, {})
    price = scores.parts["checklist/price"].tolist()
    short = scores.parts["checklist/not_too_long"].tolist()
    assert price == [1.0, 0.0, 0.0]
    assert short[0] == 1.0 and math.isnan(short[1]) and math.isnan(short[2])
    # A None item is left out of the mean: rows 2 and 3 are the price item alone.
    assert scores.column("checklist") == pytest.approx([1.0, 0.0, 0.0])
    assert scores.metrics["checklist/not_too_long/pass_rate"] == 1.0


def test_the_whole_checklist_gated_counts_closed_rows_as_otherwise(tmp_path: Path) -> None:
    raw = [
        {"type": "xml_format", "tags": ["proposal"]},
        {"type": "checklist", "items": [PRICE], "gate": {"reward": "xml_format"}},
    ]
    completions = ["<proposal>\n5 USD\n</proposal>", "5 USD"]
    with build_reward_set(parse_reward_specs(raw), BuildContext(base_dir=tmp_path)) as rewards:
        scores = rewards(["p", "p"], completions, {})
    assert scores.parts["checklist/price"].tolist() == [1.0, 0.0]
    assert scores.gated_out[:, 1].tolist() == [False, True]


def test_weighted_mean_leaves_out_none() -> None:
    assert weighted_mean([1.0, None, 0.0], [3.0, 1.0, 1.0]) == pytest.approx(0.75)
    assert weighted_mean([None, None], [1.0, 1.0]) is None
    assert weighted_mean([1.0], [0.0]) is None


def test_item_pass_rates_survive_merging_held_out_batches(tmp_path: Path) -> None:
    from grpokit.sampling.scoring import merge_scores

    with build([PRICE], tmp_path) as rewards:
        first = rewards(["p"], [COMPLETIONS[0]], {})
        second = rewards(["p", "p"], COMPLETIONS[1:], {})
    merged = merge_scores([first, second])
    assert torch.equal(merged.parts["checklist/price"], torch.tensor([1.0, 0.0, 1.0]))


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"name": "empty"}], "item 'empty': give exactly one check"),
        (
            [{"name": "both", "regex": "x", "question": "Is it {completion}?"}],
            "item 'both': give exactly one check.*it has regex, question",
        ),
        ([{"name": "bad_re", "regex": "(unclosed"}], "item 'bad_re': regex '\\(unclosed'"),
        (
            [{"name": "extra", "question": "Is there a price?", "judges": []}],
            "unknown parameter 'items.0.judges'",
        ),
        (
            [{"name": "blind", "question": "Is there a price? Answer yes or no."}],
            "item 'blind': the question has no {completion}",
        ),
        ([{"name": "has space", "regex": "x"}], "item 'has space': a name may contain only"),
        ([PRICE, PRICE], "two items are named 'price'"),
        ([{**PRICE, "gate": {"reward": "nowhere"}}], "gated on 'nowhere'"),
        ([{"name": "lengths", "min_chars": 9, "max_chars": 3}], "min_chars is larger"),
        ([{"name": "asks", "question": "{completion}?"}], "asks a question but no judge"),
    ],
)
def test_bad_items_name_the_item(items: list[dict[str, Any]], message: str, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=message):
        build(items, tmp_path)


def test_one_item_name_in_two_checklists_is_refused(tmp_path: Path) -> None:
    raw = [
        {"type": "checklist", "name": "a", "items": [PRICE]},
        {"type": "checklist", "name": "b", "items": [PRICE]},
    ]
    with pytest.raises(UserError, match="both report 'checklist/price'"):
        build_reward_set(parse_reward_specs(raw), BuildContext(base_dir=tmp_path))


def test_spec_model_accepts_the_checklist() -> None:
    spec = RewardSpec.model_validate({"type": "checklist", "items": [PRICE]})
    assert spec.display_name == "checklist"
