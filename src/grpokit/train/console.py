"""The terminal side of a run: the progress bar, and Ctrl-C that stops after a clean save."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def progress_bar(
    total: int, completed: int, *, enabled: bool = True
) -> Iterator[Callable[[int, dict[str, Any]], None]]:
    """A rich progress bar with the latest reward, KL, equal-reward share and ETA.

    Yields `advance(step, metrics)`; a no-op when disabled (logs, CI).
    """
    if not enabled:
        yield lambda step, record: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("[bold]GRPO"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=total, info="", completed=completed)

        def advance(step: int, record: dict[str, Any]) -> None:
            info = f"reward {record.get('reward', float('nan')):.3f}"
            if "kl" in record:
                info += f"  kl {record['kl']:.4f}"
            info += f"  zero-std {record.get('frac_reward_zero_std', 0):.2f}"
            bar.update(task, completed=step, info=info)

        yield advance


@contextmanager
def interrupt_guard() -> Iterator[Callable[[], bool]]:
    """First Ctrl-C finishes the current step, then the trainer saves and stops; a second one
    interrupts at once."""
    flag = {"hit": False}

    def handler(signum: int, frame: Any) -> None:
        if flag["hit"]:
            raise KeyboardInterrupt
        flag["hit"] = True

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: no signal handling
        yield lambda: False
        return
    try:
        yield lambda: flag["hit"]
    finally:
        signal.signal(signal.SIGINT, previous)
