"""Where step metrics go: metrics.jsonl (always), TensorBoard, and the terminal.

metrics.jsonl is the run's record of truth: one JSON object per optimizer step, flushed at once,
so a killed run keeps every finished step. Other sinks are views of the same dicts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class MetricsSink(Protocol):
    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...


def _clean(value: Any) -> Any:
    # JSON has no NaN; null keeps the line parseable by every reader.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonlSink:
    """Appends one line per step; on resume, lines past the resumed step are dropped first."""

    def __init__(self, path: Path, *, resume_from_step: int | None = None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_from_step is not None and path.exists():
            kept = []
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_from_step:
                        kept.append(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
            tmp.replace(path)
        self._f = path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """All parseable lines of a metrics.jsonl and the numbers of the lines skipped."""
    records: list[dict[str, Any]] = []
    skipped: list[int] = []
    if not path.exists():
        return records, skipped
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            skipped.append(lineno)
            continue
        if isinstance(rec, dict):
            records.append(rec)
        else:
            skipped.append(lineno)
    return records, skipped
