"""Tools a policy may call during a rollout: typed Python functions named in the config, described
to the chat template by a JSON schema (from the signature and the Google-style docstring), and run
outside the caller's thread with a timeout and a cap on the length of what they return.

A tool that raises, hangs, is called with bad arguments or returns something huge never stops a
run: each of those becomes the tool message ``{"error": ...}`` (or a cut result) that the model
reads in its next turn.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.errors import UserError
from grpokit.rewards.builtin.python_fn import load_function

NEEDS = (
    "a tool needs a type hint on every argument and a Google-style docstring: a description, "
    "then an 'Args:' section with one 'name: description' line per argument"
)


@dataclass(frozen=True)
class Tool:
    """One callable tool: its name (the function's), the function, and its JSON schema in the
    form chat templates take (``{"type": "function", "function": {...}}``)."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)


def tool_from_function(function: Callable[..., Any], *, where: str) -> Tool:
    """A :class:`Tool` of ``function``; ``where`` names it in the error (a config field).

    Raises:
        UserError: the function lacks type hints or a docstring describing its arguments.
    """
    from transformers.utils.chat_template_utils import get_json_schema

    try:
        schema = get_json_schema(function)
    except Exception as exc:  # transformers raises several types for the same mistake
        raise UserError(
            f"{where}: cannot describe the tool to the model ({exc}); {NEEDS}"
        ) from None
    return Tool(str(schema["function"]["name"]), function, schema)


def load_tools(entries: Sequence[str], base_dir: Path, *, field: str = "tools") -> list[Tool]:
    """The tools of the config's ``tools:`` list (``module:function`` entries; a ``.py`` path is
    relative to ``base_dir``, the config file's directory, as python rewards are).

    Raises:
        UserError: naming ``field[i]`` when an entry does not import, is not a function with type
            hints and a docstring, or repeats another tool's name.
    """
    tools: list[Tool] = []
    for i, entry in enumerate(entries):
        where = f"{field}[{i}] {entry!r}"
        function = load_function(entry, base_dir, what=f"{field}[{i}]: tool")
        tool = tool_from_function(function, where=where)
        if any(t.name == tool.name for t in tools):
            raise UserError(
                f"{where}: a tool named {tool.name!r} is already listed; names must differ"
            )
        tools.append(tool)
    return tools


class ToolFailed(Exception):
    """A tool's failure whose message is the whole error the model reads (no exception type is
    put in front of it): raised where a call ran elsewhere and its error was already written."""


@dataclass(frozen=True)
class ToolCall:
    """A call the model wrote: the tool's name and its arguments, or why it could not be read."""

    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """What one call gave back: the tool message's content (the result as text, or
    ``{"error": ...}``), whether it failed, and how long it ran."""

    name: str
    content: str
    failed: bool
    seconds: float = 0.0


def error_content(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


def result_text(value: Any, max_chars: int) -> str:
    """A tool's return value as the tool message's text, cut to ``max_chars`` characters (with a
    note saying so, so the model knows it did not see everything)."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = str(value)
    if len(text) > max_chars:
        text = f"{text[:max_chars]}... [cut: {len(text)} characters, the limit is {max_chars}]"
    return text


class ToolRunner:
    """Runs the model's tool calls: each in a thread of its own, with a timeout; the calls of
    one completion in order, those of different completions concurrently.

    Each call gets a daemon thread rather than a pool worker: a tool that never returns cannot be
    stopped from outside, and a pool would lose a worker to it for good (and wait for it when the
    process exits); a daemon thread is simply left behind. An async tool runs in its own event
    loop in that thread, cancelled at the timeout.

    Args:
        tools: the tools the model may call.
        timeout: seconds a call may run; a call still running then fails.
        max_result_chars: longest tool message; a longer result is cut.
    """

    def __init__(self, tools: Sequence[Tool], *, timeout: float, max_result_chars: int) -> None:
        if timeout <= 0 or max_result_chars < 1:
            raise ValueError("timeout must be > 0 and max_result_chars >= 1")
        self.tools = {t.name: t for t in tools}
        self.timeout = timeout
        self.max_result_chars = max_result_chars

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The JSON schemas, for the chat template's ``tools`` argument."""
        return [t.schema for t in self.tools.values()]

    def run(
        self,
        rows: Sequence[Sequence[ToolCall]],
        tools: Sequence[Mapping[str, Tool]] | None = None,
    ) -> list[list[ToolResult]]:
        """Run each row's calls in order, the rows concurrently; one result per call. A row's
        calls run one after the other because a call may depend on the one before (they can
        act on the same environment). Never raises for what a tool or a call does wrong.

        tools: the tools each row may use (an environment's methods are its own rollout's);
        default the runner's.
        """
        out: list[list[ToolResult]] = [[] for _ in rows]
        threads = []
        for i, calls in enumerate(rows):
            available = self.tools if tools is None else tools[i]
            thread = threading.Thread(
                target=self._run_row, args=(calls, available, out[i]), daemon=True
            )
            threads.append(thread)
            thread.start()
        for thread in threads:  # each call of a row is bounded by the timeout
            thread.join()
        return out

    def _run_row(
        self, calls: Sequence[ToolCall], tools: Mapping[str, Tool], out: list[ToolResult]
    ) -> None:
        for call in calls:
            out.append(self._run_call(call, tools))

    def _run_call(self, call: ToolCall, tools: Mapping[str, Tool]) -> ToolResult:
        checked = self._check(call, tools)
        if isinstance(checked, ToolResult):
            return checked
        tool, arguments = checked
        box: list[ToolResult] = []
        started = time.monotonic()
        thread = threading.Thread(target=self._call, args=(tool, arguments, box), daemon=True)
        thread.start()
        thread.join(self.timeout)
        if box:
            return box[0]
        return ToolResult(
            tool.name,
            error_content(f"{tool.name} did not finish within {self.timeout:g} s"),
            failed=True,
            seconds=time.monotonic() - started,
        )

    def _check(
        self, call: ToolCall, tools: Mapping[str, Tool]
    ) -> ToolResult | tuple[Tool, dict[str, Any]]:
        """The tool and arguments of a call, or the failed result of a call that cannot run."""
        name = call.name or "?"
        if call.error is not None:
            return ToolResult(name, error_content(call.error), failed=True)
        tool = tools.get(call.name or "")
        if tool is None:
            known = ", ".join(tools) or "none"
            return ToolResult(
                name, error_content(f"unknown tool {name!r}; the tools are: {known}"), failed=True
            )
        arguments = call.arguments or {}
        try:
            inspect.signature(tool.function).bind(**arguments)
        except TypeError as exc:
            return ToolResult(name, error_content(f"bad arguments for {name}: {exc}"), failed=True)
        return tool, arguments

    def _call(self, tool: Tool, arguments: dict[str, Any], box: list[ToolResult]) -> None:
        started = time.monotonic()
        try:
            if tool.is_async:
                value = asyncio.run(asyncio.wait_for(tool.function(**arguments), self.timeout))
            else:
                value = tool.function(**arguments)
            content, failed = result_text(value, self.max_result_chars), False
        except TimeoutError:
            content = error_content(f"{tool.name} did not finish within {self.timeout:g} s")
            failed = True
        except ToolFailed as exc:
            content, failed = error_content(str(exc)[: self.max_result_chars]), True
        except Exception as exc:  # whatever a tool raises is the model's to read, not a crash
            message = f"{type(exc).__name__}: {exc}"[: self.max_result_chars]
            content, failed = error_content(message), True
        box.append(ToolResult(tool.name, content, failed, time.monotonic() - started))
