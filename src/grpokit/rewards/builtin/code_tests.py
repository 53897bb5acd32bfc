"""``code_tests``: the share of a column's test cases that the completion's Python code passes.

Test cases (the column's value per row, or a JSON string of it):

- a list of Python snippets, e.g. ``["assert add(1, 2) == 3", ...]``: each passes if it runs to
  its end against the solution (MBPP / HumanEval style: loops, helpers, ``def check(candidate):
  ...; check(f)``, ``math.isclose`` all work);
- a list of ``{"input": "...", "output": "..."}``: the solution runs with ``input`` on stdin and
  passes if its stdout equals ``output`` (trailing spaces and trailing blank lines ignored);
- ``{"inputs": [...], "outputs": [...]}``: the same, as parallel lists (APPS style);
- a single snippet string: one case.

Every case runs in its own confined subprocess (:mod:`grpokit.rewards.sandbox`). The security
boundary, layer by layer:

- **the verdict** never comes from the process that runs the completion. Test snippets run in a
  separate checker process that never runs the completion's code: a name the tests take from the
  solution (``add``) is a request to the sandboxed process, and each answer crosses as plain data
  (numbers, strings, lists, tuples, dicts, sets, bytes, None) that the checker rebuilds with its
  own built-in types; an object that is not plain data stays a handle that equals only itself.
  Stdout cases are compared here, in the trainer. So replacing builtins, reading the harness's
  frames, exit, trace or exception hooks, a result whose ``__eq__`` always says True, or printing
  what a harness would print earn nothing: the only way to pass is to give the right answers;
- **secrets** stay out of the sandboxed process: it starts from an allow-listed environment
  (PATH, LANG, HOME and TMPDIR in its own directory), the tests and expected outputs never enter
  it, Landlock lets it read only its directory, the Python runtime and system libraries (not
  ``/etc``, ``/proc`` or the user's files), and it runs in its own PID namespace with its own
  ``/proc``;
- **the machine**: Landlock (writes only in its directory, no TCP), network and IPC namespaces,
  no capabilities, a seccomp filter (no processes, threads, exec, sockets, signals, ptrace,
  mounts, chmod/chown/utime), rlimits (CPU, memory, output size), and the trainer's wall clock;
- the Python audit hook inside the sandbox only makes errors readable: code in that interpreter
  can disable it, so it is not counted as a protection.

Which layers were in force is reported in each call's metrics (``sandbox/landlock``,
``sandbox/seccomp``, ``sandbox/pid_namespace`` ...: the share of runs that had them) and once as
a warning when some are missing; ``sandbox: strict`` refuses to run without all of them. Where
one is missing (``best_effort`` on an older kernel) what it stops becomes possible: without
Landlock the code can read what the user can, without the PID namespace see other processes;
the verdict stays out of its reach either way.

Test snippets are trusted code: the checker runs them with resource limits only, and they must not
``eval`` an answer. They may hand the solution data (None, bool, int, float, str, bytes, complex,
list, tuple, dict, set, frozenset, range) and objects it returned; anything else (a lambda, an
instance of a class of the test's) is a config error naming the row. An object of the
solution's that is not data can be called, its attributes read, and iterated (the checker gets a
list). A standard module the tests take from the solution without importing it (``math``,
``re``, ``collections`` ...) is the checker's own copy.
"""

from __future__ import annotations

import json
import logging
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grpokit.errors import UserError
from grpokit.rewards._base import Reward, RewardBatch, RewardResult
from grpokit.rewards.registry import BuildContext, register_reward
from grpokit.rewards.sandbox.launcher import (
    RunResult,
    SandboxLayers,
    SandboxLimits,
    SandboxUnavailable,
    run_python,
    sandbox_report,
)
from grpokit.rewards.text import column_value, completion_text

logger = logging.getLogger(__name__)

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
    sandbox: Literal["best_effort", "strict"] = Field(
        default="best_effort",
        description="`strict`: refuse to run any completion (a config error) unless every "
        "protection layer is in force on this machine: Landlock, seccomp, no capabilities, "
        "network and PID namespaces. `best_effort`: run with the layers this kernel has; the "
        "missing ones are named in a warning and reported as sandbox/* metrics.",
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


def _layer_metrics(layers: list[SandboxLayers]) -> dict[str, float]:
    """Per layer, the share of runs that had it; the lowest Landlock ABI seen."""
    if not layers:
        return {}
    per_run = [run.metrics() for run in layers]
    out = {key: sum(m[key] for m in per_run) / len(per_run) for key in per_run[0]}
    out["sandbox/landlock_abi"] = float(min(run.landlock_abi for run in layers))
    return out


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
        self._sandbox_checked = False

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.params.max_parallel, thread_name_prefix="grpokit-code-tests"
            )
        return self._pool

    def _check_sandbox(self) -> None:
        """Once: refuse (strict) or warn (best effort) when protection layers are missing here."""
        if self._sandbox_checked:
            return
        missing = sandbox_report().missing()
        if missing and self.params.sandbox == "strict":
            raise UserError(self._unavailable_message(missing))
        if missing:
            logger.warning(
                "reward %r: the code sandbox runs without %s. Completions cannot forge a pass, "
                "but on this machine they may read what those layers would hide; set "
                "`sandbox: strict` to refuse to run without them.",
                self.__name__,
                "; ".join(missing),
            )
        self._sandbox_checked = True

    def _unavailable_message(self, missing: list[str]) -> str:
        return (
            f"reward {self.__name__!r}: `sandbox: strict` refuses to run completions here, this "
            f"machine lacks: {'; '.join(missing)}. Run on a machine that has them, or set "
            "`sandbox: best_effort` to accept it (the missing layers are reported as sandbox/* "
            "metrics)."
        )

    def _row_cases(self, columns: dict[str, Any], row: int) -> list[CodeCase]:
        column = self.params.tests_column
        raw = column_value(columns, column, row, self.__name__)
        try:
            cases = parse_test_cases(raw) if raw is not None else []
            for number, case in enumerate(cases, start=1):
                if case.code is not None:
                    try:
                        compile(case.code, f"test case {number}", "exec")  # compiled, not run
                    except (SyntaxError, ValueError) as exc:
                        raise ValueError(f"test case {number} is not valid Python: {exc}") from None
        except ValueError as exc:
            raise UserError(
                f"reward {self.__name__!r}: row {row} of column {column!r} is not a valid set "
                f"of test cases: {exc}"
            ) from None
        return cases

    def _run_case(self, code: str, case: CodeCase) -> RunResult:
        try:
            return run_python(
                code,
                tests=case.code,
                stdin=case.stdin,
                limits=self.limits,
                strict=self.params.sandbox == "strict",
            )
        except SandboxUnavailable as exc:
            raise UserError(self._unavailable_message([str(exc)])) from None

    def evaluate(self, batch: RewardBatch) -> RewardResult:
        jobs: list[list[tuple[CodeCase, Future[RunResult]]]] = []
        scores: list[float | None] = []
        columns = dict(batch.columns)
        rows = [self._row_cases(columns, i) for i in range(len(batch.completions))]
        codes = [extract_code(completion_text(c), self.params.extract) for c in batch.completions]
        if any(cases and code.strip() for cases, code in zip(rows, codes, strict=True)):
            self._check_sandbox()
        pool = self._executor()
        for cases, code in zip(rows, codes, strict=True):
            scores.append(None if not cases else 0.0)
            if cases and code.strip():
                jobs.append([(case, pool.submit(self._run_case, code, case)) for case in cases])
            else:
                jobs.append([])
        layers: list[SandboxLayers] = []
        for i, row_jobs in enumerate(jobs):
            if not row_jobs:
                continue
            results = [(case, future.result()) for case, future in row_jobs]
            for number, (_, result) in enumerate(results, start=1):
                if result.unsupported:
                    raise UserError(
                        f"reward {self.__name__!r}: row {i} of column "
                        f"{self.params.tests_column!r}, test case {number}, cannot be checked: "
                        f"{result.unsupported}. Rewrite the test to pass data only."
                    )
            layers += [result.layers for _, result in results]
            scores[i] = sum(case_passed(case, result) for case, result in results) / len(results)
        return RewardResult(scores, metrics=_layer_metrics(layers))

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
    sandbox: Literal["best_effort", "strict"] = "best_effort",
) -> CodeTests:
    """Share of the row's test cases passed by the completion's code, run in a sandbox; None for
    a row without test cases.

    YAML: ``- {type: code_tests, tests_column: tests, timeout_s: 5, sandbox: strict}``. The
    module docstring says which layer of the sandbox stops what.

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
        sandbox=sandbox,
        **({"max_parallel": max_parallel} if max_parallel is not None else {}),
    )
    return CodeTests(params)


def _build(params: CodeTestsParams, ctx: BuildContext) -> CodeTests:
    return CodeTests(params)


register_reward("code_tests", CodeTestsParams, _build, max_value=1.0)
