"""Running untrusted Python (a model's completion) in a confined subprocess.

Each run gets a fresh temporary working directory and a separate interpreter started as
``python -I -S -X utf8`` (no site-packages, no user environment), inside ``unshare -n`` (a new,
empty network namespace; ``unshare -rn`` for a non-root user) when the machine allows it. The
child confines itself before it runs the code (see ``_sandbox_runner.py``):

- Landlock (Linux >= 5.13): file writes, creation and deletion only beneath the working
  directory; TCP connect/bind denied (ABI >= 4); signals to outside processes denied (ABI >= 6);
- a seccomp filter (x86_64, aarch64): no fork, clone, thread, exec, socket or kill;
- rlimits: CPU seconds, address space, file size (which also caps stdout/stderr, written to
  files: a program that prints too much is killed by SIGXFSZ), no core dumps, 64 descriptors,
  no processes (RLIMIT_NPROC = 0, enforced for non-root users);
- a Python audit hook that refuses the same things with a readable error, and is the only write
  guard on kernels without Landlock.

The parent enforces a wall-clock limit and kills the whole process group on expiry. Network
isolation is therefore the namespace when available, else seccomp's socket ban (else the audit
hook, on other architectures). :func:`sandbox_report` says which layers this machine has.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

_RUNNER = Path(__file__).with_name("_sandbox_runner.py")


@dataclass(frozen=True)
class SandboxLimits:
    """Bounds of one run."""

    timeout_s: float = 5.0
    """Wall-clock limit; the process group is killed after it."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS)."""
    max_output_bytes: int = 1 << 20
    """Largest file the program may write, stdout and stderr included (RLIMIT_FSIZE)."""

    @property
    def cpu_s(self) -> int:
        """CPU-time limit: the wall-clock limit rounded up, plus one second."""
        return int(self.timeout_s) + 1


@dataclass(frozen=True)
class RunResult:
    """What one run did."""

    passed: bool
    """Exit status 0 and the runner's success marker present (the code ran to its end)."""
    returncode: int | None
    """Exit status; negative = killed by that signal (e.g. -25 SIGXFSZ, -9 SIGKILL)."""
    timed_out: bool
    stdout: str
    stderr: str


_unshare_lock = threading.Lock()
_unshare_prefix: list[str] | None = None


def _network_prefix() -> list[str]:
    """``unshare -n`` (root) or ``unshare -rn`` if it works here, else nothing. Probed once."""
    global _unshare_prefix
    with _unshare_lock:
        if _unshare_prefix is None:
            _unshare_prefix = []
            unshare = shutil.which("unshare")
            if unshare is not None:
                flags = "-n" if os.geteuid() == 0 else "-rn"
                try:
                    probe = subprocess.run(
                        [unshare, flags, sys.executable, "-I", "-S", "-c", "pass"],
                        capture_output=True,
                        timeout=10,
                    )
                    if probe.returncode == 0:
                        _unshare_prefix = [unshare, flags]
                except (OSError, subprocess.SubprocessError):
                    pass
        return list(_unshare_prefix)


def run_python(
    program: str,
    *,
    tests: str | None = None,
    stdin: str = "",
    limits: SandboxLimits | None = None,
    audit_hook: bool = True,
) -> RunResult:
    """Run ``program`` (then ``tests`` in the same namespace, if given) in the sandbox.

    With ``tests`` the run passes only if both run to their end without an exception; a
    ``SystemExit`` anywhere fails it. Without ``tests`` (a stdin/stdout program), ``sys.exit(0)``
    is a normal end. Never raises for anything the program does. ``audit_hook=False`` leaves
    out the Python-level guard so that tests can check the kernel layers alone.

    >>> run_python("print(sum(map(int, input().split())))", stdin="2 3").stdout
    '5\\n'
    >>> run_python("def f(x): return x + 1", tests="assert f(1) == 3").passed
    False
    """
    limits = limits or SandboxLimits()
    base = Path(tempfile.mkdtemp(prefix="grpokit-sandbox-"))
    try:
        return _run(program, tests, stdin, limits, base, audit_hook)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(
    program: str,
    tests: str | None,
    stdin: str,
    limits: SandboxLimits,
    base: Path,
    audit_hook: bool,
) -> RunResult:
    work = base / "work"
    work.mkdir()
    program_path = base / "program.py"
    program_path.write_text(program, encoding="utf-8")
    stdin_path = base / "stdin.txt"
    stdin_path.write_text(stdin, encoding="utf-8")
    nonce = secrets.token_hex(16)
    nonce_read, nonce_write = os.pipe()
    marker_read, marker_write = os.pipe()
    config = {
        "nonce_fd": nonce_read,
        "marker_fd": marker_write,
        "program_path": str(program_path),
        "tests": tests,
        "work_dir": str(work),
        "cpu_s": limits.cpu_s,
        "memory_bytes": limits.memory_mb << 20,
        "max_file_bytes": limits.max_output_bytes,
        "audit_hook": audit_hook,
    }
    command = [
        *_network_prefix(),
        sys.executable,
        "-I",
        "-S",
        "-X",
        "utf8",
        str(_RUNNER),
        json.dumps(config),
    ]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "TMPDIR": str(work),
        "LANG": "C.UTF-8",
    }
    stdout_path, stderr_path = base / "stdout", base / "stderr"
    timed_out = False
    try:
        with (
            open(stdin_path, "rb") as stdin_file,
            open(stdout_path, "wb") as stdout_file,
            open(stderr_path, "wb") as stderr_file,
        ):
            try:
                process = subprocess.Popen(
                    command,
                    stdin=stdin_file,
                    stdout=stdout_file,
                    stderr=stderr_file,
                    cwd=work,
                    env=env,
                    pass_fds=(nonce_read, marker_write),
                    start_new_session=True,
                )
            finally:
                os.close(nonce_read)
                os.close(marker_write)
                marker_write = -1
            os.write(nonce_write, nonce.encode())
            os.close(nonce_write)
            nonce_write = -1
            try:
                returncode: int | None = process.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(process.pid)
                returncode = process.wait()
            else:
                # Anything the program left behind in its group goes too.
                _kill_group(process.pid)
        os.set_blocking(marker_read, False)
        try:
            marker = os.read(marker_read, 256).decode(errors="replace")
        except BlockingIOError:
            marker = ""
    except OSError as exc:
        return RunResult(False, None, False, "", f"sandbox: could not start: {exc}")
    finally:
        for fd in (nonce_write, marker_write, marker_read):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
    cap = limits.max_output_bytes
    stdout = _read_capped(stdout_path, cap)
    stderr = _read_capped(stderr_path, cap)
    passed = (not timed_out) and returncode == 0 and marker == nonce
    return RunResult(passed, returncode, timed_out, stdout, stderr)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read_capped(path: Path, cap: int) -> str:
    with open(path, "rb") as f:
        return f.read(cap).decode("utf-8", errors="replace")


def network_isolation() -> str:
    """How this machine cuts the sandbox off the network, in words."""
    prefix = _network_prefix()
    if prefix:
        return f"network namespace ({' '.join(Path(prefix[0]).name for _ in [0])} {prefix[1]})"
    return "no network namespace here: socket() refused by seccomp (and the audit hook)"
