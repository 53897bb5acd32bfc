"""RewardSet: gates (subset calls), weights, None handling, metrics and misbehaving rewards."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from grpokit.errors import UserError
from grpokit.rewards import BuildContext, RewardSpec, build_reward_set
from grpokit.rewards._base import RewardError
from grpokit.rewards.builtin.python_fn import load_function

USER_REWARDS = """
CALLS = []

def recorder(prompts, completions, **columns):
    CALLS.append({"prompts": list(prompts), "completions": list(completions), "columns": columns})
    return [float(len(c)) for c in completions]

def none_for_short(prompts, completions, **columns):
    return [None if len(c) < 3 else 1.0 for c in completions]

def always_none(prompts, completions, **columns):
    return [None] * len(completions)

def too_few(prompts, completions, **columns):
    return [1.0] * (len(completions) - 1)

def not_a_number(prompts, completions, **columns):
    return ["high"] * len(completions)

def infinite(prompts, completions, **columns):
    return [float("inf")] * len(completions)

def raises(prompts, completions, **columns):
    raise KeyError("boom")

def returns_tensor(prompts, completions, **columns):
    import torch
    return torch.ones(len(completions))

def returns_array(prompts, completions, **columns):
    import numpy
    return numpy.array([0.5, numpy.nan])[: len(completions)]

class Reporting:
    # A reward that reports metrics about itself, as the judge does.

    def __init__(self, rate):
        self.rate = rate
        self.last_metrics = {}

    def __call__(self, prompts, completions, **columns):
        self.last_metrics = {"judge/parse_failure_rate": self.rate, "judge/calls": len(completions)}
        return [1.0] * len(completions)

reporting_a = Reporting(0.25)
reporting_b = Reporting(0.5)

def uses_column(prompts, completions, label, **columns):
    return [1.0 if c == l else 0.0 for c, l in zip(completions, label)]
"""


@pytest.fixture()
def ctx(tmp_path: Path) -> BuildContext:
    (tmp_path / "user_rewards.py").write_text(textwrap.dedent(USER_REWARDS), encoding="utf-8")
    return BuildContext(base_dir=tmp_path, run_dir=None, seed=0)


def specs(*entries: dict[str, Any]) -> list[RewardSpec]:
    return [RewardSpec.model_validate(e) for e in entries]


def py(function: str, **extra: Any) -> dict[str, Any]:
    return {"type": "python", "function": f"user_rewards.py:{function}", **extra}


FORMAT = "<thinking>a</thinking><proposal>b</proposal>"
FORMAT_07 = "hi <thinking>a</thinking><proposal>b</proposal>"


def calls(ctx: BuildContext) -> list[dict[str, Any]]:
    recorder = load_function("user_rewards.py:recorder", ctx.base_dir)
    return recorder.__globals__["CALLS"]  # type: ignore[no-any-return]


def test_gated_reward_sees_only_passing_rows_and_their_columns(ctx: BuildContext) -> None:
    reward_set = build_reward_set(
        specs(
            {"type": "xml_format"},
            py(
                "recorder",
                name="judge",
                gate={"reward": "xml_format", "min": 1.0, "otherwise": -1.0},
            ),
        ),
        ctx,
    )
    completions = [FORMAT, "no format", FORMAT_07, FORMAT + " "]
    prompts = ["p0", "p1", "p2", "p3"]
    scores = reward_set(prompts, completions, {"answer": ["a0", "a1", "a2", "a3"]})
    recorded = calls(ctx)
    assert len(recorded) == 1
    assert recorded[0]["prompts"] == ["p0", "p3"]
    assert recorded[0]["completions"] == [FORMAT, FORMAT + " "]
    assert recorded[0]["columns"] == {"answer": ["a0", "a3"]}
    assert scores.names == ["xml_format", "judge"]
    assert scores.per_function.dtype == torch.float32
    expected = [[1.0, len(FORMAT)], [0.0, -1.0], [0.7, -1.0], [1.0, len(FORMAT) + 1]]
    assert torch.equal(scores.per_function, torch.tensor(expected, dtype=torch.float32))
    assert scores.gated_out.tolist() == [
        [False, False],
        [False, True],
        [False, True],
        [False, False],
    ]
    assert scores.metrics["rewards/judge/gated_out_frac"] == 0.5
    assert scores.metrics["rewards/xml_format/gated_out_frac"] == 0.0


def test_gate_that_nobody_passes_never_calls_the_reward(ctx: BuildContext) -> None:
    reward_set = build_reward_set(
        specs({"type": "xml_format"}, py("recorder", gate={"reward": "xml_format"})), ctx
    )
    scores = reward_set(["p", "p"], ["x", "y"], {})
    assert calls(ctx) == []
    assert scores.per_function[:, 1].tolist() == [0.0, 0.0]
    assert scores.gated_out[:, 1].all()


def test_gate_declared_before_its_dependency_and_chained(ctx: BuildContext) -> None:
    reward_set = build_reward_set(
        specs(
            py("recorder", name="judge", gate={"reward": "fmt", "otherwise": None}),
            {"type": "xml_format", "name": "fmt", "gate": {"reward": "tags", "min": 1.0}},
            {"type": "tags_present", "name": "tags"},
        ),
        ctx,
    )
    half = "<thinking>a</thinking> only"
    scores = reward_set(["p"] * 3, [FORMAT, half, FORMAT_07], {})
    assert calls(ctx)[0]["completions"] == [FORMAT]
    judge, fmt, tags = (scores.column(n) for n in ("judge", "fmt", "tags"))
    assert tags == [1.0, 0.5, 1.0]
    assert fmt == pytest.approx([1.0, 0.0, 0.7])  # row 1 gated out by tags -> otherwise 0.0
    assert judge == [float(len(FORMAT)), None, None]  # otherwise: null
    assert scores.gated_out.tolist() == [
        [False, False, False],
        [True, True, False],
        [True, False, False],
    ]


def test_weights_none_and_total(ctx: BuildContext) -> None:
    reward_set = build_reward_set(
        specs(
            {"type": "xml_format", "weight": 2.0},
            py("none_for_short", name="maybe", weight=0.5),
            py("always_none", name="never"),
        ),
        ctx,
    )
    assert reward_set.weights == [2.0, 0.5, 1.0]
    assert reward_set.max_values == [1.0, None, None]
    scores = reward_set(["p", "p", "p"], [FORMAT, "ab", FORMAT_07], {})
    assert scores.total.tolist() == pytest.approx([2.0 + 0.5, 0.0, 1.4 + 0.5])
    assert scores.column("maybe") == [1.0, None, 1.0]
    assert scores.column("never") == [None, None, None]
    m = scores.metrics
    assert m["rewards/maybe/none_frac"] == pytest.approx(1 / 3)
    assert m["rewards/never/none_frac"] == 1.0
    assert math.isnan(m["rewards/never/mean"]) and math.isnan(m["rewards/never/std"])
    assert m["rewards/xml_format/mean"] == pytest.approx((1.0 + 0.0 + 0.7) / 3)
    # Bessel-corrected std, as TRL logs it.
    assert m["rewards/xml_format/std"] == pytest.approx(torch.tensor([1.0, 0.0, 0.7]).std().item())
    assert m["rewards/maybe/std"] == 0.0


def test_row_with_only_none_has_nan_total(ctx: BuildContext) -> None:
    reward_set = build_reward_set(specs(py("always_none"), py("none_for_short")), ctx)
    scores = reward_set(["p", "p"], ["ab", "abcd"], {})
    assert math.isnan(scores.total[0].item())
    assert scores.total[1].item() == 1.0


def test_chat_message_completions_are_passed_through(ctx: BuildContext) -> None:
    reward_set = build_reward_set(specs({"type": "xml_format"}, py("recorder")), ctx)
    chat = [[{"role": "assistant", "content": FORMAT}]]
    scores = reward_set([[{"role": "user", "content": "q"}]], chat, {})
    assert scores.column("xml_format") == [1.0]
    assert calls(ctx)[0]["completions"] == chat


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("too_few", r"returned 1 values for 2 completions"),
        ("not_a_number", r"returned 'high' \(str\) at position 0"),
        ("infinite", r"returned inf"),
        ("raises", r"'bad' raised KeyError"),
    ],
)
def test_misbehaving_rewards_are_named(ctx: BuildContext, function: str, message: str) -> None:
    reward_set = build_reward_set(specs(py(function, name="bad")), ctx)
    with pytest.raises(RewardError, match=message):
        reward_set(["p", "p"], ["a", "b"], {})


def test_tensor_result_is_accepted(ctx: BuildContext) -> None:
    reward_set = build_reward_set(specs(py("returns_tensor")), ctx)
    assert reward_set(["p"], ["a"], {}).column("returns_tensor") == [1.0]


def test_numpy_result_is_accepted_with_nan_as_none(ctx: BuildContext) -> None:
    reward_set = build_reward_set(specs(py("returns_array")), ctx)
    assert reward_set(["p", "p"], ["a", "b"], {}).column("returns_array") == [0.5, None]


def test_required_columns_and_check(ctx: BuildContext) -> None:
    reward_set = build_reward_set(
        specs(
            {"type": "math_answer", "answer_column": "solution"},
            {"type": "code_tests"},
            py("uses_column", columns=["label"]),
        ),
        ctx,
    )
    assert reward_set.required_columns == {"solution", "tests", "label"}
    reward_set.check_columns(["solution", "tests", "label", "other"])
    with pytest.raises(UserError, match="reward 'math_answer' needs the column\\(s\\) solution"):
        reward_set.check_columns(["answer", "tests", "label"], source="data/train.jsonl")
    reward_set.close()
    reward_set.close()  # twice is harmless


def test_missing_column_at_call_time_names_reward(ctx: BuildContext) -> None:
    reward_set = build_reward_set(specs({"type": "math_answer"}), ctx)
    with pytest.raises(UserError, match="reward 'math_answer' needs the dataset column 'answer'"):
        reward_set(["p"], ["<answer>1</answer>"], {"gold": ["1"]})


def test_batch_shape_errors(ctx: BuildContext) -> None:
    reward_set = build_reward_set(specs({"type": "xml_format"}), ctx)
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        reward_set(["p", "q"], ["a"], {})
    with pytest.raises(ValueError, match="column 'answer' has 2 values"):
        reward_set(["p"], ["a"], {"answer": ["1", "2"]})


def test_python_function_errors(ctx: BuildContext) -> None:
    with pytest.raises(UserError, match="does not exist"):
        build_reward_set(specs({"type": "python", "function": "missing.py:f"}), ctx)
    with pytest.raises(UserError, match="no module 'not_a_module_xyz'"):
        build_reward_set(specs({"type": "python", "function": "not_a_module_xyz:f"}), ctx)
    with pytest.raises(UserError, match="has no 'nope'"):
        build_reward_set(specs({"type": "python", "function": "user_rewards:nope"}), ctx)
    (ctx.base_dir / "broken.py").write_text("raise RuntimeError('import-time failure')\n")
    with pytest.raises(UserError, match="import-time failure"):
        build_reward_set(specs({"type": "python", "function": "broken:f"}), ctx)
    with pytest.raises(Exception, match="module:function"):
        specs({"type": "python", "function": "no_colon"})


def test_importable_module_path(ctx: BuildContext) -> None:
    reward_set = build_reward_set(specs({"type": "python", "function": "os.path:basename"}), ctx)
    assert reward_set.names == ["basename"]


ALL_TYPES_YAML = """
rewards:
  - {type: xml_format, tags: [thinking, answer]}
  - {type: tags_present, tags: [thinking, answer]}
  - {type: regex_match, pattern: '<answer>\\d+</answer>'}
  - {type: json_schema, schema: {type: object}, allow_surrounding_text: true}
  - {type: math_answer, gate: {reward: xml_format, min: 1.0}}
  - {type: code_tests, timeout_s: 2, max_parallel: 1}
  - {type: length_penalty, free_length: 5, unit: words}
  - {type: soft_overlong_punishment, max_completion_len: 8, soft_punish_cache: 2}
  - {type: repetition_penalty, ngram_size: 2}
  - {type: logic_tree_depth, guarded: true}
  - {type: python, function: user_rewards:none_for_short, weight: 0.5}
"""


def test_every_builtin_type_from_yaml(ctx: BuildContext) -> None:
    import yaml

    from grpokit.rewards.spec import parse_reward_specs

    reward_set = build_reward_set(
        parse_reward_specs(yaml.safe_load(ALL_TYPES_YAML)["rewards"]), ctx
    )
    completion = "<thinking>```python\nx = 4\n```</thinking><answer>4</answer>"
    columns = {"answer": ["4"], "tests": [["assert x == 4"]], "completion_ids": [[1, 2, 3]]}
    with reward_set:
        scores = reward_set(["q"], [completion], columns)
    values = dict(zip(scores.names, (scores.column(n)[0] for n in scores.names), strict=True))
    assert values == {
        "xml_format": 1.0,
        "tags_present": 1.0,
        "regex_match": 1.0,
        "json_schema": 0.0,
        "math_answer": 1.0,
        "code_tests": 1.0,
        "length_penalty": 0.0,
        "soft_overlong_punishment": 0.0,
        "repetition_penalty": 0.0,
        "logic_tree_depth": 0.0,
        "none_for_short": 1.0,
    }


def test_rewards_own_metrics_are_merged_and_kept_apart(ctx: BuildContext) -> None:
    one = build_reward_set(
        specs({"type": "python", "name": "a", "function": "user_rewards.py:reporting_a"}), ctx
    )
    scores = one(["p", "p"], ["x", "y"], {})
    assert scores.metrics["judge/parse_failure_rate"] == 0.25
    assert scores.metrics["judge/calls"] == 2.0
    two = build_reward_set(
        specs(
            {"type": "python", "name": "a", "function": "user_rewards.py:reporting_a"},
            {
                "type": "python",
                "name": "b",
                "function": "user_rewards.py:reporting_b",
                "gate": {"reward": "a", "min": 1.0},
            },
        ),
        ctx,
    )
    scores = two(["p", "p"], ["x", "y"], {})
    assert scores.metrics["judge/a/parse_failure_rate"] == 0.25
    assert scores.metrics["judge/b/parse_failure_rate"] == 0.5
    assert "judge/parse_failure_rate" not in scores.metrics
