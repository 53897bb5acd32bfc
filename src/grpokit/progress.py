"""Progress of a long command: a bar with an ETA on a terminal, log lines elsewhere (CI logs).

Every command that runs for more than a few seconds (train, eval, generate, preflight, sft,
judge audit, export) reports through :func:`progress`, so a user always sees that work goes on
and roughly how long is left.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

LOG_EVERY_SECONDS = 30.0
"""Without a terminal, a progress line at most this often (and at the first and last item)."""


def on_terminal() -> bool:
    """Whether progress can be drawn as a live bar (stderr is a terminal, not a CI log)."""
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


def eta_text(seconds: float) -> str:
    """A remaining time as a person reads it: ``45 s``, ``3 min 20 s``, ``1 h 05 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


@dataclass
class Progress:
    """Counts items done out of ``total`` and reports them; ``advance(n, info)`` after each."""

    label: str
    total: int
    done: int = 0
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))
    every: float = LOG_EVERY_SECONDS
    _start: float = field(default_factory=time.perf_counter)
    _start_done: int = 0
    _last_line: float = -1.0
    _update: Callable[[int, str], None] | None = None

    def __post_init__(self) -> None:
        self._start_done = self.done

    def eta(self) -> float | None:
        """Seconds left at the rate measured since the start, or None before the first item."""
        rate_items = self.done - self._start_done
        if rate_items <= 0:
            return None
        per_item = (time.perf_counter() - self._start) / rate_items
        return per_item * max(0, self.total - self.done)

    def advance(self, n: int = 1, info: str = "") -> None:
        self.done += n
        if self._update is not None:
            self._update(self.done, info)
            return
        now = time.perf_counter()
        first, last = self.done - n == self._start_done, self.done >= self.total
        if first or last or now - self._last_line >= self.every:
            self._last_line = now
            eta = self.eta()
            left = f", about {eta_text(eta)} left" if eta is not None and not last else ""
            detail = f" ({info})" if info else ""
            self.log(f"{self.label}: {self.done}/{self.total}{detail}{left}")


@contextmanager
def progress(
    label: str,
    total: int,
    *,
    done: int = 0,
    enabled: bool = True,
    live: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> Iterator[Progress]:
    """Report ``total`` items of work: a live rich bar on a terminal, else a log line every
    :data:`LOG_EVERY_SECONDS` (``live`` forces one or the other; ``enabled=False`` reports
    nothing, e.g. on every process but the first)."""
    tracker = Progress(label, total, done, log=log or (lambda line: print(line, file=sys.stderr)))
    if not enabled:
        tracker._update = lambda done, info: None
        yield tracker
        return
    if not (on_terminal() if live is None else live):
        yield tracker
        return
    from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
    from rich.progress import Progress as Bar

    columns = (
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    )
    with Bar(*columns, transient=False) as bar:
        task = bar.add_task(label, total=total, info="", completed=done)
        tracker._update = lambda completed, info: bar.update(task, completed=completed, info=info)
        yield tracker
