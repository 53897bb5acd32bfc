"""Tools from the config: loading and schemas, and running calls that succeed, fail, hang or
return too much, sync and async, never on the caller's thread."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from grpokit.errors import UserError
from grpokit.rollout.tools import ToolCall, ToolRunner, load_tools, result_text

from .tool_helpers import TOOLS_MODULE


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    (tmp_path / "my_tools.py").write_text(TOOLS_MODULE)
    return tmp_path


def _runner(tools_dir: Path, *names: str, timeout: float = 5.0, cap: int = 100) -> ToolRunner:
    tools = load_tools([f"my_tools.py:{n}" for n in names], tools_dir)
    return ToolRunner(tools, timeout=timeout, max_result_chars=cap)


def test_schema_from_signature_and_docstring(tools_dir: Path) -> None:
    (calc, add) = load_tools(["my_tools.py:calculator", "my_tools.py:slow_add"], tools_dir)
    assert calc.name == "calculator" and not calc.is_async and add.is_async
    fn = calc.schema["function"]
    assert calc.schema["type"] == "function"
    assert fn["description"] == "Multiply two whole numbers."
    assert fn["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "the first factor",
    }
    assert fn["parameters"]["required"] == ["a", "b"]


@pytest.mark.parametrize(
    ("source", "entry", "message"),
    [
        ("", "missing.py:f", r"tools\[0\]: tool 'missing.py:f': file .*missing.py does not exist"),
        ("import nothing_here\n", "bad.py:f", r"tools\[0\]: tool 'bad.py:f': importing"),
        ("def f(x):\n    return x\n", "bad.py:f", r"tools\[0\] 'bad.py:f': cannot describe"),
        (
            "def f(x):\n    '''Doc.\n\n    Args:\n        x: thing\n    '''\n",
            "bad.py:f",
            r"tools\[0\] 'bad.py:f': cannot describe.*type hint",
        ),
        ("def f(x: int):\n    return x\n", "bad.py:f", "docstring"),
        ("g = 3\n", "bad.py:g", "not callable"),
    ],
    ids=["no-file", "import-error", "no-hints-no-doc", "no-hints", "no-docstring", "not-callable"],
)
def test_bad_tools_are_user_errors_naming_the_entry(
    tmp_path: Path, source: str, entry: str, message: str
) -> None:
    if source:
        (tmp_path / "bad.py").write_text(source)
    with pytest.raises(UserError, match=message):
        load_tools([entry], tmp_path)


def test_two_tools_of_one_name_refused(tools_dir: Path) -> None:
    with pytest.raises(UserError, match=r"tools\[1\].*already listed"):
        load_tools(["my_tools.py:calculator", "my_tools.py:calculator"], tools_dir)


def test_calls_run_sync_and_async_off_the_callers_thread(tools_dir: Path) -> None:
    runner = _runner(tools_dir, "calculator", "slow_add")
    seen: list[str] = []
    calc = runner.tools["calculator"]
    original = calc.function

    def recording(a: int, b: int) -> int:
        seen.append(threading.current_thread().name)
        return int(original(a, b))

    object.__setattr__(calc, "function", recording)
    (results,) = runner.run(
        [[ToolCall("calculator", {"a": 6, "b": 7}), ToolCall("slow_add", {"a": 1, "b": 2})]]
    )
    assert [(r.name, r.content, r.failed) for r in results] == [
        ("calculator", "42", False),
        ("slow_add", "3", False),
    ]
    assert seen and seen[0] != threading.current_thread().name


def test_errors_become_error_messages(tools_dir: Path) -> None:
    runner = _runner(tools_dir, "calculator", "broken")
    (results,) = runner.run(
        [
            [
                ToolCall("broken", {"x": 1}),
                ToolCall("nope", {}),
                ToolCall("calculator", {"a": 1}),  # b missing
                ToolCall("calculator", {"a": 1, "b": 2, "c": 3}),
                ToolCall(None, None, "the tool call is not JSON"),
            ]
        ]
    )
    assert all(r.failed for r in results)
    errors = [json.loads(r.content)["error"] for r in results]
    assert errors[0] == "RuntimeError: the tool broke"
    assert errors[1] == "unknown tool 'nope'; the tools are: calculator, broken"
    assert errors[2].startswith("bad arguments for calculator: missing a required argument")
    assert errors[3].startswith("bad arguments for calculator: got an unexpected keyword")
    assert errors[4] == "the tool call is not JSON"


@pytest.mark.parametrize("name", ["hang", "hang_async"])
def test_hanging_tools_time_out_together(tools_dir: Path, name: str) -> None:
    timeout, hanging = 1.0, 5
    runner = _runner(tools_dir, name, "calculator", timeout=timeout)
    t0 = time.monotonic()
    rows = runner.run(
        [[ToolCall(name, {"x": x})] for x in range(hanging)]
        + [[ToolCall("calculator", {"a": 2, "b": 2})]]
    )
    results = [r for row in rows for r in row]
    elapsed = time.monotonic() - t0
    # One timeout for all calls, not one each: the rows one after another would take at least
    # 5 s, together about 1 s (4 s to spare for a loaded machine; with 2 rows at 0.3 s and a
    # 1.5 s bound, as before, one after another would have passed too).
    assert elapsed < hanging * timeout
    assert [r.failed for r in results] == [True] * hanging + [False]
    assert json.loads(results[0].content) == {"error": f"{name} did not finish within 1 s"}
    assert results[-1].content == "4"


def test_huge_result_is_cut_with_a_note(tools_dir: Path) -> None:
    ((result,),) = _runner(tools_dir, "huge", cap=50).run([[ToolCall("huge", {"x": 1})]])
    assert not result.failed
    assert result.content == "y" * 50 + "... [cut: 10000000 characters, the limit is 50]"


def test_result_text() -> None:
    assert result_text("abc", 10) == "abc"
    assert result_text({"x": [1, 2]}, 100) == '{"x": [1, 2]}'
    assert result_text({1, 2}, 100) in ("{1, 2}", "{2, 1}")  # not JSON: str()


def test_a_rows_calls_run_in_order_rows_concurrently() -> None:
    from grpokit.rollout.tools import tool_from_function

    log: list[int] = []
    # Both rows' first calls must be running at once to pass it: rows run one after another
    # would leave the first call waiting until the runner's timeout (no wall-clock bound that a
    # loaded machine could miss).
    both_first = threading.Barrier(2)

    def step(x: int) -> int:
        """Record a step; the first ones wait for each other.

        Args:
            x: the step's number
        """
        if x == 1:
            both_first.wait()
        log.append(x)
        return x

    runner = ToolRunner([tool_from_function(step, where="test")], timeout=30, max_result_chars=10)
    rows = runner.run(
        [[ToolCall("step", {"x": 1}), ToolCall("step", {"x": 2})], [ToolCall("step", {"x": 1})]]
    )
    assert [[r.content for r in row] for row in rows] == [["1", "2"], ["1"]]
    assert log.index(2) > log.index(1)  # the second call of a row waited for the first
