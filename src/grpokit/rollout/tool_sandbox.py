"""Tools run in the code sandbox (a config's ``tools:`` entry with ``sandbox: true``).

A tool that executes what the model wrote (a Python or shell tool, a file reader) must not run
it in the trainer's process. Each call of such a tool runs in the sandbox of ``code_tests``
(:mod:`grpokit.rewards.sandbox`, docs/sandbox.md): a fresh confined subprocess with no network,
no other processes, files only in its own directory, and limits on time, memory and output. The
tool's file is its program: its source is executed there (under its own module name, so a
``__main__`` block does not run), the arguments arrive as JSON on stdin and the return value
leaves as JSON on stdout.

So a sandboxed tool is a plain (not async: the sandbox allows no sockets, which an event loop
needs) top-level function of one self-contained ``.py`` file (or module) that needs only the
standard library (the sandbox runs ``python -I -S``, without site-packages). Its module is still imported
here once, to read its signature and docstring for the schema; only the calls run confined.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from grpokit.errors import UserError
from grpokit.rewards.sandbox.launcher import RunResult, SandboxLimits, run_python
from grpokit.rollout.tools import Tool, ToolFailed

RESULT_MARK = "\n\x00grpokit-tool-result\x00"
"""Precedes the call's result on stdout, after whatever the tool printed itself."""

_DRIVER = """
import json, sys
namespace = {{"__name__": "grpokit_sandboxed_tool", "__file__": {file!r}}}
exec(compile({source!r}, {file!r}, "exec"), namespace)
value = namespace[{name!r}](**json.loads(sys.stdin.read()))
try:
    text = json.dumps({{"value": value}}, ensure_ascii=False)
except (TypeError, ValueError):
    text = json.dumps({{"value": str(value)}}, ensure_ascii=False)
sys.stdout.write({mark!r} + text)
"""


def sandbox_program(function: Callable[..., Any], *, where: str) -> str:
    """The sandbox program that runs one call of ``function``: its file's source, then the call.

    Raises:
        UserError: ``function`` is not a top-level function of a Python file (a method, a lambda,
            a function of a compiled module), so its source cannot go into the sandbox.
    """
    name = getattr(function, "__qualname__", "")
    module = inspect.getmodule(function)
    try:
        path = inspect.getsourcefile(function)
        source = None if path is None or module is None else inspect.getsource(module)
    except (OSError, TypeError):
        path, source = None, None
    if source is None or not name.isidentifier() or getattr(function, "__name__", "") != name:
        raise UserError(
            f"{where}: sandbox: true needs a top-level function of a .py file (its file is run in "
            "the sandbox); this one has no such source"
        )
    if inspect.iscoroutinefunction(function):
        raise UserError(
            f"{where}: sandbox: true takes a plain (not async) function: the sandbox allows no "
            "sockets, which an event loop needs"
        )
    return _DRIVER.format(file=str(path), source=source, name=name, mark=RESULT_MARK)


def result_of(run: RunResult, name: str, timeout: float) -> Any:
    """The value a sandboxed call returned.

    Raises:
        ToolFailed: the call raised, ran out of time or memory, or left no result; the message
            is what the model reads.
    """
    if run.timed_out:
        raise ToolFailed(f"{name} did not finish within {timeout:g} s")
    head, mark, tail = run.stdout.rpartition(RESULT_MARK)
    if run.returncode == 0 and mark:
        try:
            return json.loads(tail)["value"]
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
    if lines:  # a traceback's last line: "ValueError: ...", "MemoryError", "PermissionError: ..."
        raise ToolFailed(lines[-1])
    raise ToolFailed(f"{name} stopped without a result (exit status {run.returncode})")


def sandboxed(tool: Tool, *, where: str, limits: SandboxLimits) -> Tool:
    """``tool`` with each call run in the sandbox under ``limits`` (same name, schema and
    signature: the runner checks a call's arguments against it before starting the sandbox)."""
    program = sandbox_program(tool.function, where=where)

    @functools.wraps(tool.function)
    def call(**arguments: Any) -> Any:
        run = run_python(program, stdin=json.dumps(arguments), limits=limits)
        return result_of(run, tool.name, limits.timeout_s)

    call.__signature__ = inspect.signature(tool.function)  # type: ignore[attr-defined]
    return replace(tool, function=call)
