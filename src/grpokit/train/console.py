"""Stopping a run cleanly on request: Ctrl-C (SIGINT) and SIGTERM finish the current step, then
the trainer saves and stops. SIGTERM is what SLURM, Kubernetes and `timeout` send before they
kill a job, so it must save as Ctrl-C does."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_guard() -> Iterator[Callable[[], int | None]]:
    """Yields ``stopped()``: the number of the first stop signal received, or None.

    The first signal only sets the flag; a second one interrupts at once (KeyboardInterrupt).
    Outside the main thread signals cannot be handled and ``stopped()`` stays None.
    """
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if received:
            raise KeyboardInterrupt
        received.append(signum)

    previous: dict[int, Any] = {}
    try:
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        for number, old in previous.items():
            signal.signal(number, old)
        yield lambda: None
        return
    try:
        yield lambda: received[0] if received else None
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


@contextmanager
def reward_warnings_to(log: Callable[[str], None]) -> Iterator[None]:
    """Within the block, send the warnings rewards log (a judge whose replies hold no score, a
    sandbox layer this kernel lacks ...) to the run's own log."""
    import logging

    class _Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            log(f"[rewards] {record.getMessage()}")

    handler = _Forward(level=logging.WARNING)
    logger = logging.getLogger("grpokit.rewards")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
