"""One writer per run directory: an exclusive OS lock that ``train`` and ``sft`` hold while they
write.

The lock is ``flock`` on ``RUN_DIR/.grpokit.lock``: the kernel releases it when the process
ends, however it ends (SIGKILL, a crash, a reboot), so a stale lock never needs deleting. The
file holds who took it (PID, host, command, time) for the message a second writer gets. Readers
(eval, report, compare, export) do not take it and are never blocked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from grpokit.errors import UserError

LOCK_FILE = ".grpokit.lock"


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote into the file."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return (
            f"PID {info['pid']} on host {info['host']}, started {info['started']}: "
            f"{info['command']}"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet said who it is"


_held: dict[Path, int] = {}
"""Lock files this process holds, with how many blocks hold each: taking a lock it already
holds (a command that trains twice into one directory) nests instead of refusing itself."""


def run_lock(run_dir: Path) -> contextlib.AbstractContextManager[None]:
    """Hold ``run_dir``'s lock (``RUN_DIR/.grpokit.lock``) for the block; see :func:`_locked`."""
    return _locked(run_dir / LOCK_FILE, run_dir)


def output_lock(output: Path) -> contextlib.AbstractContextManager[None]:
    """The lock of a directory that is replaced whole when written (an SFT output): its lock
    file lies beside it, ``.<name>.grpokit.lock``, so that the replacement keeps it."""
    return _locked(output.parent / f".{output.name}{LOCK_FILE}", output)


@contextlib.contextmanager
def _locked(path: Path, directory: Path) -> Iterator[None]:
    """Hold the lock file ``path`` of ``directory`` for the block; another process asking for
    it gets a UserError naming the holder (PID, host) instead of waiting.

    ``RANK`` other than 0 (the other processes of a torchrun launch, which share the run with
    rank 0) takes no lock.
    """
    key = path.absolute()
    if os.environ.get("RANK", "0") != "0":
        yield
        return
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    created = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise UserError(
                f"{directory} is in use by another grpokit process ({_holder(fd)}); one process "
                "writes it at a time. Wait for that one to end (or stop it), or write to "
                "another directory"
            ) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(["grpokit", *sys.argv[1:]]),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
            os.ftruncate(fd, 0)  # the file no longer names a holder
            if created and os.listdir(path.parent) == [path.name]:
                # A run that failed before writing anything leaves nothing behind.
                path.unlink()
                path.parent.rmdir()
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
