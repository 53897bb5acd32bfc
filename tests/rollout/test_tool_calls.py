"""Reading tool calls out of a turn's text: Hermes / Qwen tags, Llama 3 JSON, a user's pattern."""

from __future__ import annotations

import pytest

from grpokit.rollout.tool_calls import (
    check_pattern,
    detect_format,
    parse_hermes,
    parse_lenient,
    parse_llama3,
    parse_regex,
    tool_call_parser,
)
from grpokit.rollout.tools import ToolCall

from .tool_helpers import HERMES_TEMPLATE, LLAMA3_TEMPLATE, QWEN25_TEMPLATE


def test_hermes_calls_in_order_with_text_around() -> None:
    text = (
        'I will compute. <tool_call>\n{"name": "mul", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
        ' and <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> done'
    )
    assert parse_hermes(text) == [ToolCall("mul", {"a": 2, "b": 3}), ToolCall("add", {"a": 1})]


def test_hermes_no_call_unclosed_call_and_string_arguments() -> None:
    assert parse_hermes("The answer is 6.") == []
    # The turn ended (EOS) before the closing tag: the call is still read.
    assert parse_hermes('<tool_call>{"name": "f", "arguments": {}}') == [ToolCall("f", {})]
    assert parse_hermes('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>') == [
        ToolCall("f", {"x": 1})
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"name": "f", "arguments": {"a": 1}', "not JSON"),
        ('["f"]', "must be a JSON object, got list"),
        ('{"arguments": {}}', 'needs a "name"'),
        ('{"name": "f", "arguments": [1]}', "must be an object, got list"),
        ('{"name": "f", "arguments": "{nope"}', "arguments of f are not JSON"),
    ],
)
def test_hermes_malformed_call_is_a_failed_call(body: str, message: str) -> None:
    (call,) = parse_hermes(f"<tool_call>{body}</tool_call>")
    assert call.error is not None and message in call.error
    assert call.arguments is None


def test_llama3_json_calls() -> None:
    assert parse_llama3('{"name": "mul", "parameters": {"a": 2}}') == [ToolCall("mul", {"a": 2})]
    assert parse_llama3('<|python_tag|>{"name": "f", "parameters": {}}') == [ToolCall("f", {})]
    two = '{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}'
    assert parse_llama3(two) == [ToolCall("f", {"x": 1}), ToolCall("g", {})]
    assert parse_llama3("The answer is {6}.") == []
    assert parse_llama3("{not a call at all") == []
    (broken,) = parse_llama3('{"name": "f", "parameters": {')
    assert broken.error is not None and "not JSON" in broken.error


def test_regex_with_name_and_arguments_or_a_call_group() -> None:
    by_parts = check_pattern(r"CALL (?P<name>\w+)\((?P<arguments>\{.*?\})\)")
    assert parse_regex('x CALL mul({"a": 2}) y CALL add({})', pattern=by_parts) == [
        ToolCall("mul", {"a": 2}),
        ToolCall("add", {}),
    ]
    (bad,) = parse_regex("CALL mul({a})", pattern=by_parts)
    assert bad.name == "mul" and bad.error is not None
    whole = tool_call_parser("regex", r"\[\[(?P<call>.*?)\]\]")
    assert whole('[[{"name": "f", "arguments": {"q": "x"}}]]') == [ToolCall("f", {"q": "x"})]


@pytest.mark.parametrize("pattern", [r"(unclosed", r"(?P<name>\w+)"])
def test_regex_pattern_checked(pattern: str) -> None:
    with pytest.raises(ValueError, match="regular expression|named groups"):
        check_pattern(pattern)


def test_format_detected_from_the_template() -> None:
    assert detect_format(HERMES_TEMPLATE) == "hermes"
    assert detect_format(LLAMA3_TEMPLATE) == "llama3"
    assert detect_format(QWEN25_TEMPLATE) == "hermes"  # Qwen2.5's own: <tool_call> tags
    assert detect_format("{% for m in messages %}{{ m['content'] }}{% endfor %}") is None
    assert tool_call_parser("hermes") is parse_hermes
    assert tool_call_parser("llama3") is parse_llama3


CALC = '{"name": "calculator", "arguments": {"expression": "347 * 86"}}'


@pytest.mark.parametrize(
    "text",
    [
        CALC,  # bare, the whole turn
        f"I will use the calculator.\n{CALC}",  # after prose
        f"```json\n{CALC}\n```",  # in a json code block
        f"```\n{CALC}\n```\nThen I answer.",  # in a plain code block, text after
        '{"function": ' + CALC + "}",  # inside an object that is not a call
        '{"name": "calculator", "parameters": {"expression": "347 * 86"}}',  # Llama's key
        '{"name": "calculator", "arguments": "{\\"expression\\": \\"347 * 86\\"}"}',
    ],
    ids=["bare", "after-prose", "json-block", "plain-block", "nested", "parameters", "str-args"],
)
def test_lenient_reads_a_known_tools_call_outside_the_format(text: str) -> None:
    """What Qwen2.5-Coder-0.5B-Instruct wrote instead of <tool_call> tags: the strict parser
    reads nothing, the lenient one the call."""
    assert parse_hermes(text) == []
    assert parse_lenient(text, ["calculator"]) == [
        ToolCall("calculator", {"expression": "347 * 86"})
    ]


def test_lenient_reads_only_calls_of_known_tools() -> None:
    two = f'{CALC} and {{"name": "calculator", "arguments": {{"expression": "1 + 1"}}}}'
    assert parse_lenient(two, ["calculator"]) == [
        ToolCall("calculator", {"expression": "347 * 86"}),
        ToolCall("calculator", {"expression": "1 + 1"}),
    ]
    assert parse_lenient(CALC, ["search"]) == []  # not a tool of this run
    assert parse_lenient('{"name": "calculator"}', ["calculator"]) == []  # no arguments: a mention
    assert parse_lenient('{"name": "calculator", "arguments": {', ["calculator"]) == []  # cut
    assert parse_lenient('The answer is {"value": 29842}.', ["calculator"]) == []
    assert parse_lenient("<answer>29842</answer>", ["calculator"]) == []
    # Arguments that are not an object: a call to a known tool, failed (the model is told).
    (bad,) = parse_lenient('{"name": "calculator", "arguments": [1]}', ["calculator"])
    assert bad.name == "calculator" and bad.error is not None
