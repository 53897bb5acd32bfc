"""code_tests and its sandbox, with real subprocesses: hostile code costs the reward only."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from grpokit.errors import UserError
from grpokit.rewards import code_tests
from grpokit.rewards.builtin.code_tests import (
    CodeCase,
    extract_code,
    normalize_output,
    parse_test_cases,
)
from grpokit.rewards.sandbox.launcher import SandboxLimits, run_python, sandbox_report
from tests.rewards.results import evaluate

FAST = SandboxLimits(timeout_s=2.0, memory_mb=256, max_output_bytes=64 * 1024)
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]


@pytest.fixture()
def reward():  # type: ignore[no-untyped-def]
    r = code_tests(timeout_s=2.0, memory_mb=256, max_parallel=2)
    yield r
    r.close()


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\n"


def test_passing_partial_and_failing_solutions(reward) -> None:  # type: ignore[no-untyped-def]
    completions = [
        fenced("def add(a, b):\n    return a + b"),
        fenced("def add(a, b):\n    return a + b if a > 0 else 7"),
        fenced("def add(a, b):\n    return 7"),
        "no code at all",
        "",
    ]
    scores = reward(prompts=["p"] * 5, completions=completions, tests=[ADD_TESTS] * 5)
    assert scores == [1.0, 0.5, 0.0, 0.0, 0.0]


def test_stdin_stdout_cases_and_row_without_tests(reward) -> None:  # type: ignore[no-untyped-def]
    program = fenced("a, b = map(int, input().split())\nprint(a + b)\nimport sys\nsys.exit(0)")
    io_cases = [{"input": "1 2", "output": "3"}, {"input": "5 5\n", "output": "10\n\n"}]
    apps = '{"inputs": ["2 2\\n", "0 0\\n"], "outputs": ["4\\n", "1\\n"]}'
    scores = reward(prompts=["p"] * 3, completions=[program] * 3, tests=[io_cases, apps, []])
    assert scores == [1.0, 0.5, None]


def test_infinite_loop_is_bounded(reward) -> None:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    scores = reward(
        prompts=["p"] * 2,
        completions=[
            fenced("def add(a, b):\n    while True:\n        pass"),
            fenced("while True: pass"),
        ],
        tests=[ADD_TESTS] * 2,
    )
    assert scores == [0.0, 0.0]
    # 4 cases of 2 s on 2 workers: about 4 s, never unbounded.
    assert time.monotonic() - start < 15


def test_fork_attempts_fail_the_case() -> None:
    fork_bomb = "import os\nwhile True:\n    os.fork()"
    for guard in (True, False):  # with and without the Python audit hook: the kernel says no too
        result = run_python(fork_bomb, limits=FAST, audit_hook=guard)
        assert not result.passed
        assert not result.timed_out
        assert "PermissionError" in result.stderr or "BlockingIOError" in result.stderr
    for code in (
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nassert os.system('true') == 0",  # os.system reports failure, not raises
        "import threading\nthreading.Thread(target=print).start()",
        "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    ):
        result = run_python(code, limits=FAST, audit_hook=False)
        assert not result.passed, code


def test_huge_output_is_capped() -> None:
    for code in (
        "while True:\n    print('x' * 10000)",
        "import sys\nsys.stdout.write('y' * 10**8)",
    ):
        start = time.monotonic()
        result = run_python(code, limits=FAST)
        assert not result.passed
        assert len(result.stdout) <= FAST.max_output_bytes
        assert time.monotonic() - start < 10


def test_writes_outside_the_working_directory_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "pwned.txt"
    attempts = [
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\nos.write(fd, b'x')",
        f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
        "open('../escape.txt', 'w').write('x')",
        f"import os\nos.symlink('/etc/passwd', {str(tmp_path / 'link')!r})",
    ]
    for guard in (True, False):
        for code in attempts:
            result = run_python(code, limits=FAST, audit_hook=guard)
            assert not result.passed, (guard, code)
    assert list(tmp_path.iterdir()) == []
    inside = run_python(
        "open('own.txt', 'w').write('ok')\nprint(open('own.txt').read())", limits=FAST
    )
    assert inside.passed and inside.stdout == "ok\n"


def test_crash_memory_network_and_exit_tricks() -> None:
    assert not run_python("raise SystemError('crash')", limits=FAST).passed
    assert not run_python("import ctypes\nctypes.string_at(0)", limits=FAST).passed
    assert not run_python("x = bytearray(1 << 30)", limits=FAST).passed  # 1 GiB > 256 MiB limit
    for guard in (True, False):
        net = run_python(
            "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
            limits=FAST,
            audit_hook=guard,
        )
        assert not net.passed
    # Leaving before the tests run must not count as passing them.
    for early_exit in ("import sys\nsys.exit(0)", "import os\nos._exit(0)", "exit()"):
        assert not run_python(early_exit, tests="assert False", limits=FAST).passed, early_exit


def test_the_trainer_survives_a_hostile_batch(reward) -> None:  # type: ignore[no-untyped-def]
    hostile = [
        fenced("import os\nos.fork()"),
        fenced("print('x' * 10**9)"),
        fenced("open('/tmp/grpokit-hostile.txt', 'w').write('x')"),
        fenced("import os\nos.kill(os.getppid(), 9)"),
        fenced("def add(a, b):\n    return a + b"),
    ]
    scores = reward(prompts=["p"] * 5, completions=hostile, tests=[ADD_TESTS] * 5)
    assert scores == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert not os.path.exists("/tmp/grpokit-hostile.txt")


def test_bad_test_column_is_a_user_error(reward) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UserError, match="row 0 of column 'tests'"):
        reward(prompts=["p"], completions=["x"], tests=[[{"stdin": "1"}]])
    with pytest.raises(UserError, match="needs the dataset column 'tests'"):
        reward(prompts=["p"], completions=["x"], other=[1])


def test_parsing_helpers() -> None:
    assert parse_test_cases("assert f() == 1") == [CodeCase(code="assert f() == 1")]
    assert parse_test_cases('["assert a", "assert b"]') == [
        CodeCase(code="assert a"),
        CodeCase(code="assert b"),
    ]
    assert parse_test_cases({"input": "1", "output": ["2", "3"]}) == [
        CodeCase(stdin="1", expected_stdout="2\n3")
    ]
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        parse_test_cases({"inputs": ["1", "2"], "outputs": ["1"]})
    assert extract_code("```js\nx\n```\n```\ny = 1\n```") == "y = 1\n"
    assert extract_code("plain = 1") == "plain = 1"
    assert extract_code("```python\na\n```", "whole") == "```python\na\n```"
    assert normalize_output("1  \n2\n\n\n") == ["1", "2"]


def test_test_code_forms_the_judge_runs(reward) -> None:  # type: ignore[no-untyped-def]
    # The tests run in the judge process; every name they take from the solution is a request.
    rows = {
        "humaneval check(candidate)": (
            "def total(xs):\n    return sum(xs)",
            "def total(xs):\n    return len(xs)",
            [
                "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n\n"
                "check(total)"
            ],
        ),
        "isclose, set, sorted": (
            "import math\ndef area(r):\n    return math.pi * r * r\n"
            "def common(a, b):\n    return list(set(a) & set(b))",
            "def area(r):\n    return 12\ndef common(a, b):\n    return a[:1]",
            [
                "import math\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)",
                "assert set(common([1, 2, 3], [2, 3, 4])) == {2, 3}",
                "assert sorted(common([5, 1], [1, 5])) == [1, 5]",
            ],
        ),
        "class with methods": (
            "class Stack:\n    def __init__(self):\n        self.items = []\n"
            "    def push(self, x):\n        self.items.append(x)\n"
            "    def pop(self):\n        return self.items.pop()\n"
            "    def size(self):\n        return len(self.items)",
            "class Stack:\n    def push(self, x):\n        pass\n    def pop(self):\n        return 2\n"
            "    def size(self):\n        return 2",
            ["s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2\nassert s.size() == 1"],
        ),
        "generator, exceptions, globals": (
            "LIMIT = 10\ndef evens(n):\n    return (i for i in range(0, n, 2))\n"
            "def div(a, b):\n    return a / b",
            "LIMIT = 9\ndef evens(n):\n    return [0, 2, 4]\ndef div(a, b):\n    return None",
            [
                "assert list(evens(5)) == [0, 2, 4] and LIMIT == 10",
                "try:\n    div(1, 0)\nexcept ZeroDivisionError:\n    pass\nelse:\n    raise AssertionError('no error')",
            ],
        ),
        "exact values: tuple, bytes, nested dict": (
            "def pair():\n    return (1, 2)\ndef raw():\n    return b'ab'\n"
            "def table():\n    return {(1, 'a'): [None, 2.5, {frozenset({1})}]}\n"
            "def big():\n    return 3 ** 10000",
            "def pair():\n    return [1, 2]\ndef raw():\n    return 'ab'\n"
            "def table():\n    return {(1, 'a'): [None, 2.5]}\ndef big():\n    return 3 ** 9999",
            [
                "assert pair() == (1, 2)",
                "assert raw() == b'ab'",
                "assert table() == {(1, 'a'): [None, 2.5, {frozenset({1})}]}",
                "assert big() == 3 ** 10000",
            ],
        ),
    }
    completions = [fenced(code) for good, bad, _ in rows.values() for code in (good, bad)]
    tests = [cases for _, _, cases in rows.values() for _ in range(2)]
    result = evaluate(reward, ["p"] * len(completions), completions, tests=tests)
    scores = result.values
    by_row = {name: (scores[2 * i], scores[2 * i + 1]) for i, name in enumerate(rows)}
    assert by_row == {name: (1.0, 0.0) for name in rows}
    metrics = result.metrics
    layers = sandbox_report()
    assert metrics["sandbox/landlock_abi"] == layers.landlock_abi
    assert metrics["sandbox/seccomp"] == float(layers.seccomp)
    assert metrics["sandbox/pid_namespace"] == float(layers.pid_namespace)


def test_tests_the_judge_cannot_check_are_user_errors(reward) -> None:  # type: ignore[no-untyped-def]
    solution = fenced("def apply(f, x):\n    return f(x)")
    with pytest.raises(UserError, match=r"row 0 of column 'tests', test case 1, cannot be checked"):
        reward(prompts=["p"], completions=[solution], tests=[["assert apply(lambda x: x, 1) == 1"]])
    with pytest.raises(UserError, match="test case 2 is not valid Python"):
        reward(prompts=["p"], completions=[solution], tests=[["assert True", "assert (("]])


def test_strict_sandbox(reward) -> None:  # type: ignore[no-untyped-def]
    if sandbox_report().missing():
        strict = code_tests(sandbox="strict", max_parallel=1)
        with pytest.raises(UserError, match="`sandbox: strict` refuses"):
            strict(prompts=["p"], completions=[fenced("x = 1")], tests=[["assert x == 1"]])
        return
    strict = code_tests(sandbox="strict", timeout_s=2.0, max_parallel=1)
    assert strict(prompts=["p"], completions=[fenced("x = 1")], tests=[["assert x == 1"]]) == [1.0]
    strict.close()
