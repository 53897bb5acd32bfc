"""What a failed or stopped run tells its user: the cause in one line, and the files it saved."""

from __future__ import annotations

import errno
import shutil
import signal
from pathlib import Path

from grpokit.rewards._base import RewardError

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class NonFiniteSteps(RuntimeError):
    """Too many optimizer steps in a row had a NaN or infinite loss or gradient norm."""

    def __init__(self, count: int) -> None:
        super().__init__(
            f"{count} optimizer steps in a row had a NaN or infinite loss or gradient norm and "
            "were skipped (the weights are those of the last good step). Likely causes: a "
            "learning rate too high for this model (lower training.learning_rate), rewards on "
            "a very large scale (keep them within a few units, or scale_rewards: group), or "
            "float16 overflow (use bfloat16 or float32)"
        )
        self.count = count


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a write that found no space left."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _size(n: int) -> str:
    """A byte count for people: 512 bytes, 3.4 MB, 1.2 GB."""
    if n < 1024:
        return f"{n} bytes"
    value, unit = n / 1024, "KB"
    for bigger in ("MB", "GB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def disk_full_advice(run_dir: Path, latest: Path | None) -> str:
    """Which disk is full, how much is free on it and how much the next checkpoint needs (the
    size of the last one), in one sentence."""
    try:
        free = f"{_size(shutil.disk_usage(run_dir).free)} free"
    except OSError:
        free = "free space unknown"
    if latest is None:
        need = "there is no earlier checkpoint to size the next one by"
    else:
        taken = sum(p.stat().st_size for p in latest.rglob("*") if p.is_file())
        need = f"a checkpoint takes about {_size(taken)} ({latest.name})"
    return f"the disk holding {run_dir} is full ({free}; {need}): free space, then resume"


def describe_failure(exc: BaseException) -> str:
    """The cause of a failure in one line, with what usually helps for the common ones."""
    if isinstance(exc, (RewardError, NonFiniteSteps)):
        return str(exc)
    if is_disk_full(exc):
        return f"no space left on the disk ({exc})"
    name = type(exc).__name__
    if isinstance(exc, MemoryError) or "OutOfMemoryError" in name:
        return (
            f"out of memory ({name}: {exc}). Lower training.per_device_train_batch_size (more "
            "gradient_accumulation_steps keeps the batch), max_completion_length or "
            "max_tokens_per_micro_batch, or turn on gradient_checkpointing"
        )
    return f"{name}: {exc}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
