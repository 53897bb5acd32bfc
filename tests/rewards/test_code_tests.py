"""code_tests and its sandbox, with real subprocesses: hostile code costs the reward only."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from grpokit.errors import UserError
from grpokit.rewards import code_tests
from grpokit.rewards.code_rewards import CodeCase, extract_code, normalize_output, parse_test_cases
from grpokit.rewards.sandbox import SandboxLimits, run_python

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
