"""Hand-made cases for math_answer, regex_match and json_schema."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from grpokit.errors import UserError
from grpokit.rewards import (
    BuildContext,
    RewardSpec,
    build_reward_set,
    json_schema,
    math_answer,
    regex_match,
)
from grpokit.rewards.builtin.math_answer import (
    answers_equal,
    extract_answer,
    extract_boxed,
    extract_last_number,
)


@pytest.mark.parametrize(
    ("gold", "predicted", "equal"),
    [
        ("0.5", "1/2", True),
        ("1/2", "\\frac{1}{2}", True),
        ("\\frac12", "0.5", True),
        ("72", "72.0", True),
        ("1,000", "1000", True),
        ("\\sqrt{2}", "2^{1/2}", True),
        ("3", "x = 3", True),
        ("-4", "-4", True),
        ("1/3", "0.33", False),
        ("72", "27", False),
        ("\\pi", "3.14159", False),
    ],
)
def test_answers_equal(gold: str, predicted: str, equal: bool) -> None:
    assert answers_equal(gold, predicted) is equal


def test_extraction_order_and_sources() -> None:
    text = "first 3, then \\boxed{\\frac{1}{2}} and <answer>0.5</answer> then 9"
    assert extract_answer(text, ["tag", "boxed", "last_number"]) == "0.5"
    assert extract_answer(text, ["boxed", "tag"]) == "\\frac{1}{2}"
    assert extract_answer(text, ["last_number"]) == "9"
    assert extract_answer("nothing here", ["tag", "boxed", "last_number"]) is None
    assert extract_boxed("\\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert extract_boxed("\\boxed{unclosed") is None
    assert extract_last_number("total: -1,234.5 yen") == "-1,234.5"


def test_math_answer_reward() -> None:
    reward = math_answer()
    completions = [
        "<thinking>7*6</thinking><answer>42</answer>",
        "The result is \\boxed{42.0}",
        "I think it is 41",
        [{"role": "assistant", "content": "<answer>42</answer>"}],
        "no answer",
        "<answer>42</answer>",
    ]
    answers = ["42", "42", "42", "42", "42", None]
    scores = reward(prompts=["q"] * 6, completions=completions, answer=answers)
    assert scores == [1.0, 1.0, 0.0, 1.0, 0.0, None]


def test_math_answer_gsm8k_gold_and_custom_tag() -> None:
    reward = math_answer("solution", answer_tag="final", gold_after="####")
    scores = reward(
        prompts=["q", "q"],
        completions=["<final>18</final>", "<final>1</final>"],
        solution=["She sells 16 - 3 - 4 = 9 eggs... 9 * 2 = 18\n#### 18"] * 2,
    )
    assert scores == [1.0, 0.0]


def test_math_answer_works_off_the_main_thread() -> None:
    reward = math_answer()
    results: list[list[float | None]] = []
    thread = threading.Thread(
        target=lambda: results.append(
            reward(prompts=["q"], completions=["<answer>\\frac{1}{2}</answer>"], answer=["0.5"])
        )
    )
    thread.start()
    thread.join(timeout=60)
    assert results == [[1.0]]


def test_math_answer_unparseable_gold_is_none() -> None:
    reward = math_answer()
    assert reward(prompts=["q"], completions=["<answer>5</answer>"], answer=["\\\\\\"]) == [None]


def test_regex_match() -> None:
    reward = regex_match(r"^answer:\s*\d+$", flags=["IGNORECASE", "MULTILINE"], no_match_score=-0.5)
    assert reward(prompts=None, completions=["work\nANSWER: 12", "answer: twelve"]) == [1.0, -0.5]
    full = regex_match(r"\d+", mode="fullmatch")
    assert full(prompts=None, completions=[" 12 ", "12a"]) == [1.0, 0.0]


SCHEMA = {
    "type": "object",
    "required": ["name", "price"],
    "properties": {"name": {"type": "string"}, "price": {"type": "number", "minimum": 0}},
    "additionalProperties": False,
}


def test_json_schema_strict_and_partial() -> None:
    completions = [
        '{"name": "box", "price": 3}',
        '```json\n{"name": "box", "price": 3}\n```',
        '{"name": "box", "price": -1}',
        '{"name": 5, "price": "x"}',
        '{"name": "box", "price": 3, "extra": 1}',
        "[1, 2]",
        "not json",
        'The JSON: {"name": "box", "price": 3}',
    ]
    strict = json_schema(SCHEMA)
    assert strict(prompts=None, completions=completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    partial = json_schema(SCHEMA, partial_credit=True, allow_surrounding_text=True)
    assert partial(prompts=None, completions=completions) == [
        1.0,
        1.0,
        0.5,
        0.25,
        0.75,
        0.25,
        0.0,
        1.0,
    ]


def test_json_schema_from_file_and_errors(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    ctx = BuildContext(base_dir=tmp_path, run_dir=None, seed=0)
    reward_set = build_reward_set(
        [RewardSpec.model_validate({"type": "json_schema", "schema_file": "s.json"})], ctx
    )
    assert reward_set(["p"], ['{"name": "a", "price": 1}'], {}).column("json_schema") == [1.0]
    missing = RewardSpec.model_validate({"type": "json_schema", "schema_file": "nope.json"})
    with pytest.raises(UserError, match="nope.json does not exist"):
        build_reward_set([missing], ctx)
    with pytest.raises(ValueError, match="exactly one of"):
        RewardSpec.model_validate({"type": "json_schema"})
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        RewardSpec.model_validate({"type": "json_schema", "schema": {"type": "no-such-type"}})
