"""Tools with ``sandbox: true``: each call runs in the code sandbox, a real confined subprocess
(docs/sandbox.md). What the model makes such a tool do cannot read the trainer's files or
environment, reach the network, or outlast its time and memory; its failures are tool messages."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import AutoTokenizer

from grpokit.config import load_config
from grpokit.errors import UserError
from grpokit.rewards.sandbox.launcher import sandbox_report
from grpokit.rollout.tools import ToolCall, ToolResult
from grpokit.sampling import tool_rollout

from .tool_helpers import HERMES_TEMPLATE

TOOLS = '''
import asyncio
import contextlib
import io


def run_code(code: str) -> str:
    """Run a Python program and return what it printed.

    Args:
        code: the program
    """
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    return out.getvalue()


def run_code_here(code: str) -> str:
    """The same tool, run in the trainer's process.

    Args:
        code: the program
    """
    return run_code(code)


async def double(x: int) -> int:
    """Twice a number, asynchronously.

    Args:
        x: the number
    """
    await asyncio.sleep(0)
    return 2 * x


def total(values: list[int]) -> dict:
    """The sum of some numbers.

    Args:
        values: the numbers
    """
    return {"sum": sum(values)}


class Box:
    def method(self, x: int) -> int:
        """A method.

        Args:
            x: anything
        """
        return x


if __name__ == "__main__":
    raise SystemExit("the tool file's main block must not run in the sandbox")
'''


def _config(tmp_path: Path, model_dir: Path, tools: list[Any]) -> Path:
    (tmp_path / "my_tools.py").write_text(TOOLS)
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "Hi"}) + "\n")
    doc = {
        "model": {"name_or_path": str(model_dir), "chat_template": "hermes"},
        "data": {"train": "train.jsonl"},
        "rewards": [{"type": "regex_match", "pattern": "x"}],
        "tools": tools,
        "training": {"tool_timeout": 3.0, "report_to": ["none"]},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def run_calls(tmp_path: Path, tiny_model_dir: Path) -> Any:
    """Runs calls through the tool runner of a config whose run_code and double are sandboxed."""
    tools = [
        {"function": "my_tools.py:run_code", "sandbox": True, "memory_mb": 256},
        "my_tools.py:run_code_here",
        {"function": "my_tools.py:total", "sandbox": True},
    ]
    cfg = load_config(_config(tmp_path, tiny_model_dir, tools))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = HERMES_TEMPLATE
    rollout = tool_rollout(cfg, tokenizer)
    assert rollout is not None and rollout.names == ["run_code", "run_code_here", "total"]

    def run(*calls: tuple[str, dict[str, Any]]) -> list[ToolResult]:
        return [r for (r,) in rollout.runner.run([[ToolCall(n, a)] for n, a in calls])]

    return run


def _error(result: ToolResult) -> str:
    assert result.failed, result
    message: str = json.loads(result.content)["error"]
    return message


def test_sandboxed_calls_return_what_the_tool_returns(run_calls: Any) -> None:
    code, here, values = run_calls(
        ("run_code", {"code": "print(6 * 7)"}),
        ("run_code_here", {"code": "print(6 * 7)"}),
        ("run_code", {"code": "print(open('mine.txt', 'w').write('ok'))"}),  # its own directory
    )
    assert (code.content, code.failed) == ("42\n", False)
    assert here.content == code.content  # the same tool in this process
    assert values.content == "2\n"
    (total,) = run_calls(("total", {"values": [1, 2, 3]}))
    assert json.loads(total.content) == {"sum": 6} and not total.failed  # JSON back, as here
    bad = run_calls(("run_code", {"program": "1"}))[0]  # refused before any sandbox starts
    assert _error(bad).startswith("bad arguments for run_code")
    raised = run_calls(("run_code", {"code": "raise ValueError('no such thing')"}))[0]
    assert _error(raised) == "ValueError: no such thing"


def test_what_the_model_runs_stays_in_the_sandbox(
    run_calls: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layers = sandbox_report()
    if layers.missing():
        pytest.skip(f"this machine lacks sandbox layers: {layers.missing()}")
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    monkeypatch.setenv("GRPOKIT_TEST_SECRET", "hunter3")
    read = f"print(open({str(secret)!r}).read())"
    here, confined = run_calls(("run_code_here", {"code": read}), ("run_code", {"code": read}))
    assert here.content == "hunter2\n"  # the trainer's process can read it; the sandbox cannot
    assert "PermissionError" in _error(confined) and "hunter2" not in confined.content
    environ = "import os; print(os.environ.get('GRPOKIT_TEST_SECRET'))"
    assert run_calls(("run_code", {"code": environ}))[0].content == "None\n"
    connect = "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)"
    assert "Error" in _error(run_calls(("run_code", {"code": connect}))[0])


def test_a_hanging_or_greedy_call_is_stopped(run_calls: Any) -> None:
    start = time.monotonic()
    hang, memory = run_calls(
        ("run_code", {"code": "while True: pass"}),
        ("run_code", {"code": "x = bytearray(2 << 30)"}),
    )
    assert time.monotonic() - start < 10  # the 3 s limit, both calls concurrently
    assert _error(hang) == "run_code did not finish within 3 s"
    assert _error(memory) == "MemoryError"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"function": "my_tools.py:Box.method", "sandbox": True}, "top-level function"),
        ({"function": "my_tools.py:double", "sandbox": True}, "not async"),
        ({"function": "my_tools.py:nothing", "sandbox": True}, "has no 'nothing'"),
        ({"function": "calculator", "sandbox": True}, "is not of the form"),
        ({"function": "my_tools.py:run_code", "sandbox": "yes please"}, "sandbox"),
    ],
)
def test_bad_sandboxed_tool_entries(
    tmp_path: Path, tiny_model_dir: Path, entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(UserError, match=message):
        cfg = load_config(_config(tmp_path, tiny_model_dir, [entry]))
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        tokenizer.chat_template = HERMES_TEMPLATE
        tool_rollout(cfg, tokenizer)
