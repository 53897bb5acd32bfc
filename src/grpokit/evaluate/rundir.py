"""Reading a run directory for the report: tolerant of runs that were killed mid-write.

A run directory holds config.yaml, versions.json, metrics.jsonl (one JSON object per optimizer
step), completions.jsonl (sampled completions) and optionally preflight.json. Lines that cannot be
read are skipped and listed with the reason, so the report can say what it left out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpokit.errors import UserError


@dataclass(frozen=True)
class SkippedLine:
    """A line of a JSONL file that the report could not use."""

    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file} line {self.line}: {self.reason}"


@dataclass
class RunData:
    """Everything the report shows about one run."""

    run_dir: Path
    config_text: str | None
    config: dict[str, Any]
    versions: dict[str, str]
    metrics: list[dict[str, Any]]
    """One row per step, sorted by step; a step logged twice (a resumed run) keeps its last row."""
    completions: list[dict[str, Any]]
    preflight: dict[str, Any] | None
    skipped: list[SkippedLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def steps(self) -> list[int]:
        return [int(r["step"]) for r in self.metrics]

    def keys(self) -> set[str]:
        """Every numeric metric name that appears in at least one step."""
        out: set[str] = set()
        for row in self.metrics:
            out.update(k for k, v in row.items() if _number(v) is not None and k != "step")
        return out

    def series(self, key: str) -> tuple[list[int], list[float | None]]:
        """(steps, values) of one metric; None where a step lacks it."""
        return self.steps, [_number(r.get(key)) for r in self.metrics]

    def has(self, key: str) -> bool:
        return any(v is not None for v in self.series(key)[1])

    def alerts(self) -> list[dict[str, Any]]:
        """The monitor alerts recorded in metrics.jsonl, in step order."""
        out: list[dict[str, Any]] = []
        for row in self.metrics:
            for alert in row.get("alerts") or []:
                if isinstance(alert, dict) and "rule" in alert:
                    out.append({"step": row["step"], **alert})
        return out

    def reward_names(self) -> list[str]:
        """Reward functions in the order of the config, else as they appear in the metrics."""
        found = sorted(
            {
                k.split("/")[1]
                for k in self.keys()
                if k.startswith("rewards/") and k.endswith("/mean")
            }
        )
        configured: list[str] = []
        for entry in self.config.get("rewards") or []:
            if isinstance(entry, dict):
                name = entry.get("name") or entry.get("type")
                if isinstance(name, str) and name in found:
                    configured.append(name)
        return configured + [n for n in found if n not in configured]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def read_jsonl(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[SkippedLine]]:
    """The JSON objects of a JSONL file with their 1-based line numbers, and the lines skipped."""
    rows: list[tuple[int, dict[str, Any]]] = []
    skipped: list[SkippedLine] = []
    if not path.is_file():
        return rows, skipped
    raw = path.read_bytes()
    lines = raw.decode("utf-8", errors="replace").split("\n")
    # A file written line by line ends with "\n": the last element is then empty.
    last = len(lines) - (1 if lines and lines[-1] == "" else 0)
    for number, line in enumerate(lines[:last], start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            cut = number == last and not raw.endswith(b"\n")
            why = "truncated (the run was probably stopped mid-write)" if cut else "not valid JSON"
            skipped.append(SkippedLine(path.name, number, f"{why}: {e.msg} at column {e.colno}"))
            continue
        if not isinstance(row, dict):
            skipped.append(SkippedLine(path.name, number, "not a JSON object"))
            continue
        rows.append((number, row))
    return rows, skipped


def _read_json(path: Path, notes: list[str]) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        notes.append(f"{path.name} could not be read ({e}); left out")
        return None


def load_run(run_dir: Path) -> RunData:
    """Read a run directory; raises UserError when it is missing or has no usable metrics."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} does not exist")
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise UserError(
            f"{metrics_path} does not exist: is {run_dir} a grpokit run directory (the "
            f"training.output_dir of a run)?"
        )
    notes: list[str] = []
    rows, skipped = read_jsonl(metrics_path)
    by_step: dict[int, dict[str, Any]] = {}
    for number, row in rows:
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            skipped.append(SkippedLine(metrics_path.name, number, f"no integer 'step' ({step!r})"))
            continue
        if step in by_step:
            notes.append(f"step {step} is logged more than once (a resumed run); the last is shown")
        by_step[step] = row
    if not by_step:
        what = f" ({len(skipped)} unreadable lines)" if skipped else ""
        raise UserError(
            f"{metrics_path} has no metrics rows{what}: the run has not logged a step yet"
        )
    completions, skipped_c = read_jsonl(run_dir / "completions.jsonl")
    config_path = run_dir / "config.yaml"
    config_text = config_path.read_text(encoding="utf-8") if config_path.is_file() else None
    config: dict[str, Any] = {}
    if config_text is not None:
        try:
            loaded = yaml.safe_load(config_text)
            config = loaded if isinstance(loaded, dict) else {}
        except yaml.YAMLError as e:
            notes.append(f"config.yaml is not valid YAML ({e}); shown as text")
    versions = _read_json(run_dir / "versions.json", notes)
    preflight = _read_json(run_dir / "preflight.json", notes)
    return RunData(
        run_dir=run_dir,
        config_text=config_text,
        config=config,
        versions={str(k): str(v) for k, v in versions.items()}
        if isinstance(versions, dict)
        else {},
        metrics=[by_step[s] for s in sorted(by_step)],
        completions=[row for _, row in completions],
        preflight=preflight if isinstance(preflight, dict) else None,
        skipped=sorted(skipped, key=lambda s: s.line) + skipped_c,
        notes=notes,
    )
