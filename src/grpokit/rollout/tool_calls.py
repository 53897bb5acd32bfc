"""Reading the tool calls out of a model's turn, one parser per chat-template family.

- ``hermes`` (Hermes, Qwen2.5 / Qwen3 and other ChatML tool templates): each call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; a last call left unclosed at the
  end of the turn counts too.
- ``llama3`` (Llama 3.1+ JSON tool calling): the whole turn is ``{"name": ..., "parameters":
  {...}}`` (optionally after ``<|python_tag|>``), or several such objects separated by ``;``.
- ``regex``: a pattern of the user's, with named groups ``name`` and ``arguments`` (a JSON
  object), or one group ``call`` holding ``{"name": ..., "arguments": ...}``.

Beside them, :func:`parse_lenient` finds the calls a model writes outside its format: a bare JSON
object naming a known tool, or one in a json code block. Real instruct models do this (a
Qwen2.5-Coder-0.5B wrote 15 of 64 calculator calls so); the rollout counts such calls, and runs
them only when asked to (training.tool_call_lenient).

Pure functions of the turn's text. A call whose JSON does not read becomes a :class:`ToolCall`
with ``error`` set (the model is told, and the call counts as failed), never an exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from functools import partial
from typing import Any, Literal

from grpokit.rollout.tools import ToolCall

ToolCallFormat = Literal["hermes", "llama3", "regex"]
Parser = Callable[[str], list[ToolCall]]

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


def call_from_json(body: Any) -> ToolCall:
    """A call from its decoded JSON: ``name`` and ``arguments`` (or Llama's ``parameters``), the
    arguments an object or a string holding one."""
    if not isinstance(body, dict):
        return ToolCall(None, None, f"a tool call must be a JSON object, got {_kind(body)}")
    name = body.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, None, 'a tool call needs a "name" string')
    arguments = body.get("arguments", body.get("parameters", {}))
    if isinstance(arguments, str):  # some templates write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCall(name, None, f"the arguments of {name} are not JSON: {exc}")
    if not isinstance(arguments, dict):
        return ToolCall(
            name, None, f"the arguments of {name} must be an object, got {_kind(arguments)}"
        )
    return ToolCall(name, arguments)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _call_from_text(text: str) -> ToolCall:
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        return ToolCall(None, None, f"the tool call is not JSON ({exc}): {text[:200]!r}")
    return call_from_json(body)


def parse_hermes(text: str) -> list[ToolCall]:
    """The ``<tool_call>...</tool_call>`` calls of a turn, in order.

    >>> parse_hermes('Let me compute. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    [ToolCall(name='add', arguments={'a': 1}, error=None)]
    """
    return [_call_from_text(m.group(1).strip()) for m in _HERMES.finditer(text)]


def parse_llama3(text: str) -> list[ToolCall]:
    """The JSON calls of a Llama 3 turn: the turn is nothing but the call(s).

    A turn that does not start with ``{`` is an answer, not a call. One that starts with ``{`` and
    names a tool but does not read as JSON is a failed call.

    >>> parse_llama3('{"name": "add", "parameters": {"a": 1}}')
    [ToolCall(name='add', arguments={'a': 1}, error=None)]
    >>> parse_llama3('The answer is 3.')
    []
    """
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].strip()
    if not body.startswith("{"):
        return []
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    position = 0
    while position < len(body):
        try:
            value, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError as exc:
            if calls or '"name"' in body[position:]:
                calls.append(ToolCall(None, None, f"the tool call is not JSON ({exc})"))
            return calls
        calls.append(call_from_json(value))
        rest = body[end:].lstrip()
        if not rest:
            break
        if not rest.startswith(";"):  # text after the call: the turn is not only calls
            return calls
        position = len(body) - len(rest[1:].lstrip())
    return calls


def parse_lenient(text: str, names: Collection[str]) -> list[ToolCall]:
    """The JSON objects in ``text`` that name one of the tools ``names`` and carry its arguments
    (``arguments``, or Llama's ``parameters``), wherever they stand: bare, after some prose, or in
    a json code block.

    Only an object whose ``name`` is a known tool counts: any other JSON a model writes (an
    example, a result) is not a call. An object nested in one that is not a call (OpenAI's
    ``{"function": {...}}``, a list of calls) is still found.

    >>> parse_lenient('```json\\n{"name": "add", "arguments": {"a": 1}}\\n```', ["add"])
    [ToolCall(name='add', arguments={'a': 1}, error=None)]
    >>> parse_lenient('{"name": "other", "arguments": {}}', ["add"])
    []
    """
    if '"name"' not in text or not any(n in text for n in names):
        return []  # the common answer turn: no decoding at every brace
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    position = text.find("{")
    while position >= 0:
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            end = -1
        if end > 0 and _names_a_tool(value, names):
            calls.append(call_from_json(value))
            position = text.find("{", end)
        else:  # not JSON from here, or not a call: look inside it for one
            position = text.find("{", position + 1)
    return calls


def _names_a_tool(value: Any, names: Collection[str]) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return False
    return value["name"] in names and ("arguments" in value or "parameters" in value)


def check_pattern(pattern: str) -> re.Pattern[str]:
    """The compiled pattern of ``regex`` parsing.

    Raises:
        ValueError: it does not compile, or lacks the groups ``name`` and ``arguments`` (or
            ``call``).
    """
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
    groups = set(compiled.groupindex)
    if "call" not in groups and not {"name", "arguments"} <= groups:
        raise ValueError(
            f"{pattern!r} needs the named groups (?P<name>...) and (?P<arguments>...), or one "
            "group (?P<call>...) holding the call's JSON"
        )
    return compiled


def parse_regex(text: str, *, pattern: re.Pattern[str]) -> list[ToolCall]:
    """The calls ``pattern`` finds (see :func:`check_pattern` for its groups).

    >>> p = check_pattern(r"CALL (?P<name>\\w+) (?P<arguments>\\{.*?\\})")
    >>> parse_regex('CALL add {"a": 1}', pattern=p)
    [ToolCall(name='add', arguments={'a': 1}, error=None)]
    """
    calls = []
    for match in pattern.finditer(text):
        if "call" in pattern.groupindex and match.group("call") is not None:
            calls.append(_call_from_text(match.group("call").strip()))
            continue
        name, arguments = match.group("name"), match.group("arguments") or "{}"
        try:
            calls.append(call_from_json({"name": name, "arguments": json.loads(arguments)}))
        except json.JSONDecodeError as exc:
            calls.append(ToolCall(name, None, f"the arguments of {name} are not JSON: {exc}"))
    return calls


def detect_format(chat_template: str) -> ToolCallFormat | None:
    """The tool-call format a chat template teaches, from its text; None when it is not one of
    the known families."""
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|start_header_id|>" in chat_template and (
        "ipython" in chat_template or '"parameters"' in chat_template
    ):
        return "llama3"
    return None


def tool_call_parser(fmt: ToolCallFormat, pattern: str | None = None) -> Parser:
    """The parser of a format (``regex`` needs ``pattern``)."""
    if fmt == "hermes":
        return parse_hermes
    if fmt == "llama3":
        return parse_llama3
    if pattern is None:
        raise ValueError("the regex tool-call format needs a pattern")
    return partial(parse_regex, pattern=check_pattern(pattern))
