"""``code_tests``: the share of a column's test cases that the completion's Python code passes.

Every test case runs in its own confined subprocess (:mod:`grpokit.rewards.sandbox`: temporary
working directory, wall-clock and CPU limits, memory and output caps, no processes, no network,
no writes outside its directory). A hanging, crashing, forking or file-writing completion fails
its cases; the trainer never sees an exception from it.

Test cases (the column's value per row, or a JSON string of it):

- a list of Python snippets, e.g. ``["assert add(1, 2) == 3", ...]``: each runs after the
  solution in the same namespace and passes if it raises nothing (MBPP / HumanEval style);
- a list of ``{"input": "...", "output": "..."}``: the solution runs with ``input`` on stdin and
  passes if its stdout equals ``output`` (trailing spaces and trailing blank lines ignored);
- ``{"inputs": [...], "outputs": [...]}``: the same, as parallel lists (APPS style);
- a single snippet string: one case.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grpokit.errors import UserError
from grpokit.rewards._base import Reward
from grpokit.rewards._text import column_value, completion_text
from grpokit.rewards.registry import BuildContext, register_reward
from grpokit.rewards.sandbox import RunResult, SandboxLimits, run_python

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


class CodeTestsParams(BaseModel):
    """Parameters of ``code_tests``."""

    model_config = ConfigDict(extra="forbid")

    tests_column: str = Field(
        default="tests", description="Dataset column holding each row's test cases."
    )
    extract: Literal["last_fence", "whole"] = Field(
        default="last_fence",
        description="`last_fence`: the last ```python (or unlabelled) code block, or the whole "
        "completion if it has none; `whole`: the completion as it is.",
    )
    timeout_s: float = Field(
        default=5.0, gt=0, le=300, description="Wall-clock limit per test case, in seconds."
    )
    memory_mb: int = Field(
        default=512, ge=64, description="Address-space limit per test case, in MiB."
    )
    max_output_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        description="Largest stdout/stderr or file a test case may write; beyond it the case fails.",
    )
    max_parallel: int = Field(
        default_factory=lambda: max(1, min(4, os.cpu_count() or 1)),
        ge=1,
        description="Test cases run at the same time (subprocesses).",
    )


@dataclass(frozen=True)
class CodeCase:
    """One test: a snippet to run after the solution, or stdin with the expected stdout."""

    code: str | None = None
    stdin: str = ""
    expected_stdout: str | None = None


def parse_test_cases(value: Any) -> list[CodeCase]:
    """Normalise a column value into test cases (see the module docstring for the forms).

    >>> parse_test_cases('[{"input": "1 2", "output": "3"}]')
    [CodeCase(code=None, stdin='1 2', expected_stdout='3')]

    Raises:
        ValueError: the value is none of the accepted forms.
    """
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("[", "{"):
            try:
                value = json.loads(stripped)
            except ValueError:
                return [CodeCase(code=value)]
        else:
            return [CodeCase(code=value)] if stripped else []
    if isinstance(value, dict):
        if "inputs" in value and "outputs" in value:
            inputs, outputs = value["inputs"], value["outputs"]
            if not isinstance(inputs, list) or not isinstance(outputs, list):
                raise ValueError("`inputs` and `outputs` must be lists")
            if len(inputs) != len(outputs):
                raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs")
            return [
                CodeCase(stdin=_text(i), expected_stdout=_text(o))
                for i, o in zip(inputs, outputs, strict=True)
            ]
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"expected a list of test cases, got {type(value).__name__}")
    cases: list[CodeCase] = []
    for item in value:
        if isinstance(item, str):
            cases.append(CodeCase(code=item))
        elif isinstance(item, dict) and "output" in item:
            cases.append(
                CodeCase(stdin=_text(item.get("input", "")), expected_stdout=_text(item["output"]))
            )
        else:
            raise ValueError(
                f"a test case must be a code string or {{'input': ..., 'output': ...}}, got {item!r}"
            )
    return cases


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def extract_code(text: str, mode: Literal["last_fence", "whole"] = "last_fence") -> str:
    """The code to test: the last python/unlabelled fenced block, or the whole text.

    >>> extract_code("Here:\\n```python\\nx = 1\\n```\\nand\\n```py\\nx = 2\\n```")
    'x = 2\\n'
    """
    if mode == "whole":
        return text
    blocks = [
        body
        for language, body in _FENCE_RE.findall(text)
        if language.lower() in ("", "python", "py", "python3")
    ]
    return blocks[-1] if blocks else text


def normalize_output(text: str) -> list[str]:
    """Lines with trailing whitespace removed, trailing blank lines dropped."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def case_passed(case: CodeCase, result: RunResult) -> bool:
    """Whether a run satisfies its case."""
    if not result.passed:
        return False
    if case.expected_stdout is None:
        return True
    return normalize_output(result.stdout) == normalize_output(case.expected_stdout)


class CodeTests(Reward):
    """The ``code_tests`` reward (see :func:`code_tests`)."""

    def __init__(self, params: CodeTestsParams, name: str = "code_tests") -> None:
        super().__init__(name)
        self.params = params
        self.required_columns = frozenset({params.tests_column})
        self.limits = SandboxLimits(
            timeout_s=params.timeout_s,
            memory_mb=params.memory_mb,
            max_output_bytes=params.max_output_bytes,
        )
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.params.max_parallel, thread_name_prefix="grpokit-code-tests"
            )
        return self._pool

    def _run_case(self, code: str, case: CodeCase) -> bool:
        result = run_python(
            code,
            tests=case.code,
            stdin=case.stdin,
            limits=self.limits,
        )
        return case_passed(case, result)

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        p = self.params
        jobs: list[list[Future[bool]]] = []
        scores: list[float | None] = []
        pool = self._executor()
        for i, completion in enumerate(completions):
            raw = column_value(columns, p.tests_column, i, self.__name__)
            try:
                cases = parse_test_cases(raw) if raw is not None else []
            except ValueError as exc:
                raise UserError(
                    f"reward {self.__name__!r}: row {i} of column {p.tests_column!r} is not a "
                    f"valid set of test cases: {exc}"
                ) from None
            code = extract_code(completion_text(completion), p.extract)
            if not cases:
                scores.append(None)
                jobs.append([])
            elif not code.strip():
                scores.append(0.0)
                jobs.append([])
            else:
                scores.append(0.0)
                jobs.append([pool.submit(self._run_case, code, case) for case in cases])
        for i, futures in enumerate(jobs):
            if futures:
                scores[i] = sum(f.result() for f in futures) / len(futures)
        return scores

    def __getstate__(self) -> dict[str, Any]:
        # A worker pool cannot be pickled; the copy starts its own on first use.
        state = dict(self.__dict__)
        state["_pool"] = None
        return state

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def code_tests(
    tests_column: str = "tests",
    *,
    extract: Literal["last_fence", "whole"] = "last_fence",
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_parallel: int | None = None,
) -> CodeTests:
    """Share of the row's test cases passed by the completion's code, run in a sandbox; None for
    a row without test cases.

    YAML: ``- {type: code_tests, tests_column: tests, timeout_s: 5}``.

    >>> reward = code_tests(timeout_s=5)
    >>> reward(
    ...     prompts=["write add"] * 2,
    ...     completions=["```python\\ndef add(a, b):\\n    return a + b\\n```", "def add(a, b): return a"],
    ...     tests=[["assert add(1, 2) == 3", "assert add(0, 0) == 0"]] * 2,
    ... )
    [1.0, 0.5]
    >>> reward.close()
    """
    params = CodeTestsParams(
        tests_column=tests_column,
        extract=extract,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        **({"max_parallel": max_parallel} if max_parallel is not None else {}),
    )
    return CodeTests(params)


def _build(params: CodeTestsParams, ctx: BuildContext) -> CodeTests:
    return CodeTests(params)


register_reward("code_tests", CodeTestsParams, _build, max_value=1.0)
