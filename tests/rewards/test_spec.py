"""The rewards: YAML list: per-entry parameter validation and cross-entry checks."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pydantic
import pytest

from grpokit.errors import UserError
from grpokit.rewards import get_reward_type, register_reward, reward_types
from grpokit.rewards.builtin.format import XmlFormatParams
from grpokit.rewards.spec import (
    GateSpec,
    RewardSpec,
    gate_order,
    parse_reward_specs,
    validate_reward_specs,
)


def spec(**entry: Any) -> RewardSpec:
    return RewardSpec.model_validate(entry)


def test_flat_entry_is_parsed_with_the_types_params_model() -> None:
    s = spec(type="xml_format", tags=["thinking", "answer"], weight=0.5)
    assert isinstance(s.params, XmlFormatParams)
    assert s.params.tags == ["thinking", "answer"]
    assert s.display_name == "xml_format"
    assert s.weight == 0.5 and s.gate is None
    gated = spec(type="math_answer", name="correct", gate={"reward": "xml_format", "min": 0.7})
    assert gated.display_name == "correct"
    assert gated.gate == GateSpec(reward="xml_format", min=0.7, otherwise=0.0)


def test_unknown_type_lists_known_types() -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        spec(type="xml_fromat")
    message = str(err.value)
    assert "unknown reward type 'xml_fromat'" in message
    for known in ("xml_format", "math_answer", "code_tests", "python"):
        assert known in message


def test_unknown_parameter_names_entry_and_field() -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        spec(type="math_answer", name="acc", answer_col="answer")
    message = str(err.value)
    assert "reward 'acc'" in message
    assert "unknown parameter 'answer_col'" in message
    assert "answer_column" in message  # the parameters it does have


def test_wrong_parameter_type_and_missing_parameter() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"parameter 'timeout_s'"):
        spec(type="code_tests", timeout_s="soon")
    with pytest.raises(pydantic.ValidationError, match=r"missing required parameter 'pattern'"):
        spec(type="regex_match")
    with pytest.raises(pydantic.ValidationError, match="not a valid regular expression"):
        spec(type="regex_match", pattern="(unclosed")
    with pytest.raises(pydantic.ValidationError, match="gate"):
        spec(type="xml_format", gate={"reward": "x", "minimum": 1})


@pytest.mark.parametrize("name", ["has space", "a/b", ""])
def test_bad_metric_names(name: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        spec(type="xml_format", name=name)


def test_duplicate_names() -> None:
    with pytest.raises(UserError, match="two rewards are named 'xml_format'"):
        validate_reward_specs([spec(type="xml_format"), spec(type="xml_format", tags=["a"])])
    validate_reward_specs([spec(type="xml_format"), spec(type="xml_format", name="fmt2")])


def test_gate_on_missing_reward() -> None:
    with pytest.raises(UserError, match="gated on 'format'.*known names: xml_format, math_answer"):
        validate_reward_specs(
            [spec(type="xml_format"), spec(type="math_answer", gate={"reward": "format"})]
        )


def test_gate_on_itself_and_cycles() -> None:
    with pytest.raises(UserError, match="gated on itself"):
        validate_reward_specs([spec(type="xml_format", gate={"reward": "xml_format"})])
    with pytest.raises(UserError, match="cycle: a -> c -> b -> a"):
        validate_reward_specs(
            [
                spec(type="xml_format", name="a", gate={"reward": "c"}),
                spec(type="tags_present", name="b", gate={"reward": "a"}),
                spec(type="regex_match", name="c", pattern="x", gate={"reward": "b"}),
            ]
        )


def test_empty_list() -> None:
    with pytest.raises(UserError, match="empty"):
        validate_reward_specs([])


def test_gate_order_is_topological_and_stable() -> None:
    specs = [
        spec(type="math_answer", gate={"reward": "fmt"}),
        spec(type="regex_match", pattern="x"),
        spec(type="xml_format", name="fmt", gate={"reward": "tags_present"}),
        spec(type="tags_present"),
    ]
    validate_reward_specs(specs)
    order = gate_order(specs)
    names = [specs[i].display_name for i in order]
    assert names.index("tags_present") < names.index("fmt") < names.index("math_answer")
    assert sorted(order) == [0, 1, 2, 3]
    plain = [
        spec(type="xml_format"),
        spec(type="tags_present"),
        spec(type="regex_match", pattern="a"),
    ]
    assert gate_order(plain) == [0, 1, 2]


def test_parse_reward_specs_names_source_and_index() -> None:
    with pytest.raises(UserError, match=r"cfg.yaml: rewards\[1\]: .*unknown parameter 'tag'"):
        parse_reward_specs(
            [{"type": "xml_format"}, {"type": "tags_present", "tag": "a"}], source="cfg.yaml"
        )
    with pytest.raises(UserError, match="must be a list"):
        parse_reward_specs({"type": "xml_format"})


def test_registry_lookup_and_registration_rules() -> None:
    types = reward_types()
    for name in (
        "xml_format",
        "tags_present",
        "regex_match",
        "json_schema",
        "math_answer",
        "code_tests",
        "length_penalty",
        "soft_overlong_punishment",
        "repetition_penalty",
        "logic_tree_depth",
        "python",
    ):
        assert name in types
    assert get_reward_type("xml_format").max_value == 1.0
    assert get_reward_type("logic_tree_depth").max_value is None
    with pytest.raises(UserError, match="known types"):
        get_reward_type("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_reward("xml_format", XmlFormatParams, lambda params, ctx: print)
    with pytest.raises(ValueError, match="identifier"):
        register_reward("bad name", XmlFormatParams, lambda params, ctx: print)


def test_importing_the_package_is_lazy() -> None:
    code = (
        "import sys, grpokit.rewards\n"
        "heavy = [m for m in ('math_verify', 'jsonschema', 'torch', 'grpokit.rewards.builtin.code_tests')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
