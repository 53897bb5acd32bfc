"""The parent side of the sandbox: running untrusted Python in confined subprocesses.

Two processes per run with tests, one without:

- the **sandbox** (``runner.py``) runs the untrusted program as
  ``python -I -S -X utf8`` with an allow-listed environment (PATH, LANG, and HOME/TMPDIR set to
  its fresh working directory), inside ``unshare`` user, network, IPC, mount and PID namespaces
  with its own ``/proc`` when the machine allows them. It confines itself before the program runs
  (Landlock, no capabilities, seccomp, rlimits; see the runner) and reports on its own pipe
  which layers took effect, then closes that pipe;
- the **checker** (``checker.py``), for tests written as code, runs the test code and
  never the program: the names the tests take from the solution are requests to the sandbox,
  answered with plain data. It decides pass or fail on its own objects and tells the parent on
  a pipe the sandbox never holds. For stdin/stdout tests there is no checker: the caller compares
  the output here, in the parent.

So nothing the untrusted code does inside its process (replacing builtins, reading frames,
rigging ``__eq__``, exit or trace hooks, printing what a harness would print) can produce a
pass: it can only give answers, and an answer passes when it is right. What keeps the code from
reading secrets (files, other processes' memory and environment) or harming the machine are the
kernel layers: :class:`SandboxLayers` records which were in force for each run,
:func:`sandbox_report` probes this machine, and ``strict=True`` refuses to run without all of
them. The parent enforces the wall clock and kills both process groups when it expires.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

from grpokit.rewards.sandbox.wire import MessageReader, WireError

_HERE = Path(__file__).parent
_RUNNER = _HERE / "runner.py"
_CHECKER = _HERE / "checker.py"
_PYTHON = [sys.executable, "-I", "-S", "-X", "utf8"]


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds of one run."""

    timeout_s: float = 5.0
    """Wall-clock limit; the process groups are killed after it."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS)."""
    max_output_bytes: int = 1 << 20
    """Largest file the program may write, stdout and stderr included (RLIMIT_FSIZE); also the
    largest answer it may send the checker."""

    @property
    def cpu_s(self) -> int:
        """CPU-time limit: the wall-clock limit rounded up, plus one second."""
        return int(self.timeout_s) + 1


# What a missing layer means, and what gives it.
_LAYER_NEEDS = {
    "landlock": "Landlock file rules (Linux >= 5.13 with Landlock among the LSMs, e.g. "
    "lsm=landlock,...): without them the code can read any file the user can",
    "seccomp": "the seccomp filter (x86_64 or aarch64 Linux)",
    "no_capabilities": "dropping every capability (capset)",
    "net_namespace": "a network namespace (`unshare --net`; for a non-root user, unprivileged "
    "user namespaces)",
    "pid_namespace": "a PID namespace with its own /proc (`unshare --pid --fork --mount-proc`): "
    "without it the code can see other processes",
}


@dataclass(frozen=True)
class SandboxLayers:
    """The protections in force around one run (all False: the sandbox did not start)."""

    landlock_abi: int = 0
    """Landlock ABI version used (0 = none): >= 1 reads and writes confined, >= 4 no TCP,
    >= 6 signals and abstract unix sockets confined to the sandbox."""
    seccomp: bool = False
    no_capabilities: bool = False
    user_namespace: bool = False
    net_namespace: bool = False
    pid_namespace: bool = False
    audit_hook: bool = False
    """The Python-level guard: readable errors, not a boundary."""

    def missing(self) -> list[str]:
        """The layers ``strict`` requires that were not in force, each with what gives it."""
        present = {
            "landlock": self.landlock_abi >= 1,
            "seccomp": self.seccomp,
            "no_capabilities": self.no_capabilities,
            "net_namespace": self.net_namespace,
            "pid_namespace": self.pid_namespace,
        }
        return [_LAYER_NEEDS[name] for name, ok in present.items() if not ok]

    def metrics(self) -> dict[str, float]:
        """``sandbox/<layer>``: 1.0 in force, 0.0 not; ``sandbox/landlock_abi`` the version."""
        out = {f"sandbox/{f.name}": float(getattr(self, f.name)) for f in fields(self)}
        out["sandbox/landlock"] = float(self.landlock_abi >= 1)
        out["sandbox/landlock_tcp"] = float(self.landlock_abi >= 4)
        out["sandbox/landlock_scoped"] = float(self.landlock_abi >= 6)
        return out


class SandboxUnavailable(RuntimeError):
    """``strict`` was asked and a protection layer is missing on this machine."""


@dataclass(frozen=True)
class RunResult:
    """What one run did."""

    passed: bool
    """With tests: the checker ran them to their end. Without: exit status 0 within the limits
    (the caller then compares stdout)."""
    returncode: int | None
    """The sandbox's exit status; negative = killed by that signal (e.g. -9 SIGKILL)."""
    timed_out: bool
    stdout: str
    stderr: str
    layers: SandboxLayers = SandboxLayers()
    detail: str = ""
    """Why the checker failed the tests (an assertion, the solution's exception, a broken link)."""
    unsupported: str = ""
    """Set when the tests hand the solution something that cannot cross as data: the test, not
    the solution, is at fault."""


@dataclass(frozen=True)
class _Namespaces:
    prefix: tuple[str, ...]
    user: bool
    net: bool


_namespaces_lock = threading.Lock()
_namespaces_found: _Namespaces | None = None


def _namespaces() -> _Namespaces:
    """The strongest ``unshare`` prefix that works here. Probed once per process."""
    global _namespaces_found
    with _namespaces_lock:
        if _namespaces_found is None:
            _namespaces_found = _Namespaces((), False, False)
            unshare = shutil.which("unshare")
            pid = ("--ipc", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child")
            user = ("--user", "--map-root-user")
            tries = [(user + ("--net",) + pid, True), (user + ("--net",), True)]
            if os.geteuid() == 0:
                tries[1:1] = [(("--net",) + pid, False)]
                tries.append((("--net",), False))
            for flags, with_user in tries if unshare else []:
                prefix = (str(unshare), *flags)
                try:
                    probe = subprocess.run(
                        [*prefix, *_PYTHON, "-c", "pass"], capture_output=True, timeout=10
                    )
                except (OSError, subprocess.SubprocessError):
                    continue
                if probe.returncode == 0:
                    _namespaces_found = _Namespaces(prefix, with_user, True)
                    break
        return _namespaces_found


_report_lock = threading.Lock()
_report: SandboxLayers | None = None


def sandbox_report() -> SandboxLayers:
    """The layers a run gets on this machine (one probe run, then cached)."""
    global _report
    with _report_lock:
        if _report is None:
            _report = run_python("pass", limits=SandboxLimits(timeout_s=10.0)).layers
        return _report


def run_python(
    program: str,
    *,
    tests: str | None = None,
    stdin: str = "",
    limits: SandboxLimits | None = None,
    audit_hook: bool = True,
    strict: bool = False,
) -> RunResult:
    """Run ``program`` in the sandbox; with ``tests``, check them against it.

    ``tests`` is Python code run by the checker (see the module docstring); the run passes when it
    runs to its end. Without ``tests`` (a stdin/stdout program) the run passes when the program
    exits with status 0 (``sys.exit(0)`` included) within the limits. Never raises for anything
    the program does. ``audit_hook=False`` leaves out the Python-level guard so that tests can
    check the kernel layers alone.

    Raises:
        SandboxUnavailable: ``strict`` and a layer of :meth:`SandboxLayers.missing` is missing;
            the program is not run.

    >>> run_python("print(sum(map(int, input().split())))", stdin="2 3").stdout
    '5\\n'
    >>> run_python("def f(x): return x + 1", tests="assert f(1) == 3").passed
    False
    """
    limits = limits or SandboxLimits()
    if strict:
        missing = sandbox_report().missing()
        if missing:
            raise SandboxUnavailable("; ".join(missing))
    base = Path(tempfile.mkdtemp(prefix="grpokit-sandbox-"))
    try:
        result = _Run(program, tests, stdin, limits, base, audit_hook, strict).run()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if strict and result.layers.missing():
        raise SandboxUnavailable("; ".join(result.layers.missing()))
    return result


class _Run:
    """One run: the sandbox process, the checker process when there are tests, their pipes."""

    def __init__(
        self,
        program: str,
        tests: str | None,
        stdin: str,
        limits: SandboxLimits,
        base: Path,
        audit_hook: bool,
        strict: bool,
    ) -> None:
        self.program, self.tests, self.stdin, self.limits = program, tests, stdin, limits
        self.base, self.audit_hook, self.strict = base, audit_hook, strict
        self.fds: list[int] = []  # every descriptor this run opened and has not closed

    def pipe(self) -> tuple[int, int]:
        read, write = os.pipe()
        self.fds += [read, write]
        return read, write

    def close(self, *fds: int) -> None:
        for fd in fds:
            if fd in self.fds:
                self.fds.remove(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def run(self) -> RunResult:
        try:
            return self._run()
        except OSError as exc:
            return RunResult(False, None, False, "", f"sandbox: could not start: {exc}")
        finally:
            self.close(*list(self.fds))

    def _run(self) -> RunResult:
        work = self.base / "work"
        work.mkdir()
        program_path = self.base / "program.py"
        program_path.write_text(self.program, encoding="utf-8")
        stdin_path = self.base / "stdin.txt"
        stdin_path.write_text(self.stdin if self.tests is None else "", encoding="utf-8")
        namespaces = _namespaces()
        layers_read, layers_write = self.pipe()
        config: dict[str, Any] = {
            "mode": "program" if self.tests is None else "serve",
            "layers_fd": layers_write,
            "program_path": str(program_path),
            "work_dir": str(work),
            "cpu_s": self.limits.cpu_s,
            "memory_bytes": self.limits.memory_mb << 20,
            "max_file_bytes": self.limits.max_output_bytes,
            "max_message_bytes": self.limits.max_output_bytes,
            "audit_hook": self.audit_hook,
            "strict": self.strict,
        }
        sandbox_fds = [layers_write]
        if self.tests is not None:
            request_read, request_write = self.pipe()
            reply_read, reply_write = self.pipe()
            verdict_read, verdict_write = self.pipe()
            config.update(request_fd=request_read, reply_fd=reply_write)
            sandbox_fds += [request_read, reply_write]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work), "TMPDIR": str(work)}
        deadline = time.monotonic() + self.limits.timeout_s
        stdout_path, stderr_path = self.base / "stdout", self.base / "stderr"
        checker: subprocess.Popen[bytes] | None = None
        verdict: dict[str, Any] | None = None
        with (
            open(stdin_path, "rb") as stdin_file,
            open(stdout_path, "wb") as stdout_file,
            open(stderr_path, "wb") as stderr_file,
        ):
            sandbox = subprocess.Popen(
                [*namespaces.prefix, *_PYTHON, str(_RUNNER), json.dumps(config)],
                stdin=stdin_file,
                stdout=stdout_file,
                stderr=stderr_file,
                cwd=work,
                env=env,
                pass_fds=sandbox_fds,
                start_new_session=True,
            )
            self.close(*sandbox_fds)
            try:
                if self.tests is not None:
                    checker = self._start_checker(request_write, reply_read, verdict_write)
                    self.close(request_write, reply_read, verdict_write)
                    timed_out = _wait(checker, deadline) is None
                else:
                    timed_out = _wait(sandbox, deadline) is None
            finally:
                # Whatever is left in either group goes: a timeout, or children left behind.
                for process in (sandbox, checker):
                    if process is not None:
                        _kill_group(process.pid)
                        process.wait()
        # Read once every writer is gone (nothing can block): the checker's verdict, and the
        # layers the sandbox reported before any untrusted code ran.
        if checker is not None and not timed_out:
            verdict = _read_message(verdict_read, self.limits.max_output_bytes)
        returncode = sandbox.returncode
        report = _read_message(layers_read, 4096) or {}
        layers = _layers(report, namespaces, self.audit_hook)
        cap = self.limits.max_output_bytes
        stdout, stderr = _read_capped(stdout_path, cap), _read_capped(stderr_path, cap)
        if self.tests is None:
            passed = not timed_out and returncode == 0
            return RunResult(passed, returncode, timed_out, stdout, stderr, layers)
        verdict = verdict or {}
        detail = "timed out" if timed_out else str(verdict.get("detail", "no verdict"))
        return RunResult(
            passed=verdict.get("passed") is True and not timed_out,
            returncode=returncode,
            timed_out=timed_out,
            stdout=stdout,
            stderr=stderr,
            layers=layers,
            detail="" if verdict.get("passed") is True else detail,
            unsupported=str(verdict.get("unsupported", "")),
        )

    def _start_checker(
        self, request_write: int, reply_read: int, verdict_write: int
    ) -> subprocess.Popen[bytes]:
        checker_dir = self.base / "checker"
        checker_dir.mkdir()
        config = {
            "tests": self.tests,
            "request_fd": request_write,
            "reply_fd": reply_read,
            "verdict_fd": verdict_write,
            "cpu_s": self.limits.cpu_s,
            "memory_bytes": self.limits.memory_mb << 20,
            "max_message_bytes": self.limits.max_output_bytes,
        }
        checker = subprocess.Popen(
            [*_PYTHON, str(_CHECKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=checker_dir,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(checker_dir)},
            pass_fds=(request_write, reply_read, verdict_write),
            start_new_session=True,
        )
        # The tests go through a pipe: never in a file or on a command line, where the sandbox
        # could read them.
        stdin: IO[bytes] = checker.stdin  # type: ignore[assignment]
        with contextlib.suppress(BrokenPipeError):
            stdin.write(json.dumps(config).encode())
        with contextlib.suppress(BrokenPipeError):
            stdin.close()
        return checker


def _wait(process: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The exit status, or None when the deadline passed first.

    Waits on a pidfd (Linux >= 5.3): ``Popen.wait(timeout=...)`` polls with sleeps of up to
    50 ms, which added about 40 ms to a run of 80 ms.
    """
    remaining = max(0.0, deadline - time.monotonic())
    try:
        pidfd = os.pidfd_open(process.pid)
    except OSError:
        pidfd = -1
    if pidfd < 0:
        try:
            return process.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            return None
    try:
        exited, _, _ = select.select([pidfd], [], [], remaining)
    finally:
        os.close(pidfd)
    return process.wait() if exited else None


def _layers(report: dict[str, Any], namespaces: _Namespaces, audit_hook: bool) -> SandboxLayers:
    """The layers the sandbox reported (before any untrusted code ran) plus the namespaces."""
    if not report:
        return SandboxLayers()
    abi = report.get("landlock_abi")
    return SandboxLayers(
        landlock_abi=abi if type(abi) is int else 0,
        seccomp=report.get("seccomp") is True,
        no_capabilities=report.get("no_capabilities") is True,
        user_namespace=namespaces.user,
        net_namespace=namespaces.net,
        pid_namespace=report.get("pid_namespace") is True,
        audit_hook=report.get("audit_hook") is True and audit_hook,
    )


def _read_message(fd: int, max_bytes: int) -> dict[str, Any] | None:
    """The first message on a pipe whose writers are gone, or None."""
    try:
        return MessageReader(fd, max_bytes).read()
    except (WireError, OSError):
        return None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read_capped(path: Path, cap: int) -> str:
    with open(path, "rb") as f:
        return f.read(cap).decode("utf-8", errors="replace")
