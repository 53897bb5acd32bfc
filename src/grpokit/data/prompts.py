"""Prompt sets: JSONL, CSV or a `datasets` directory, validated row by row.

Every column other than the prompt reaches the reward functions as a keyword argument (TRL's
convention), so a row is kept whole. Errors name the file and line and say what to fix.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit.errors import UserError

Prompt = str | list[dict[str, str]]


@dataclass(frozen=True)
class PromptRow:
    """One prompt with the rest of its row. `source` is 'file:line' for messages."""

    prompt: Prompt
    columns: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def _check_prompt(value: Any, where: str, column: str) -> Prompt:
    if isinstance(value, str):
        if not value.strip():
            raise UserError(f"{where}: column {column!r} is empty")
        return value
    if isinstance(value, list) and value:
        for i, msg in enumerate(value):
            if not (
                isinstance(msg, dict)
                and isinstance(msg.get("role"), str)
                and isinstance(msg.get("content"), str)
            ):
                raise UserError(
                    f"{where}: message {i} of {column!r} must be "
                    '{"role": "system"|"user"|"assistant", "content": "..."}'
                )
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise UserError(
        f"{where}: column {column!r} must be a non-empty string or a list of chat messages, "
        f"got {type(value).__name__}"
    )


def _row(record: Any, where: str, column: str) -> PromptRow:
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object per line, got {type(record).__name__}")
    if column not in record:
        keys = ", ".join(sorted(record)) or "none"
        raise UserError(
            f"{where}: no {column!r} column (columns: {keys}); set data.prompt_column or rename it"
        )
    columns = {k: v for k, v in record.items() if k != column}
    return PromptRow(_check_prompt(record[column], where, column), columns, where)


def _read_jsonl(path: Path, column: str) -> list[PromptRow]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            rows.append(_row(record, where, column))
    return rows


def _read_csv(path: Path, column: str) -> list[PromptRow]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        # Line numbers count the header as line 1, as an editor shows them.
        return [_row(dict(r), f"{path}:{reader.line_num}", column) for r in reader]


def _read_datasets_dir(path: Path, column: str) -> list[PromptRow]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises several types for a wrong directory
        raise UserError(f"{path}: not a `datasets` save_to_disk directory ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise UserError(f"{path}: a DatasetDict without a 'train' split ({list(ds)})")
        ds = ds["train"]
    return [_row(dict(r), f"{path}[{i}]", column) for i, r in enumerate(ds)]


def load_prompts(path: str | Path, *, prompt_column: str = "prompt") -> list[PromptRow]:
    """Load a prompt set; the format is chosen by the file extension (or a directory).

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "p.jsonl")
    >>> _ = open(p, "w").write('{"prompt": "1+1?", "answer": "2"}\\n')
    >>> load_prompts(p)[0].columns
    {'answer': '2'}
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"prompt file {path} does not exist")
    if path.is_dir():
        rows = _read_datasets_dir(path, prompt_column)
    elif path.suffix in (".jsonl", ".json"):
        rows = _read_jsonl(path, prompt_column)
    elif path.suffix == ".csv":
        rows = _read_csv(path, prompt_column)
    else:
        raise UserError(f"{path}: unknown prompt file type; use .jsonl, .csv or a datasets dir")
    if not rows:
        raise UserError(f"{path}: no prompts")
    return rows


def columns_of(rows: Sequence[PromptRow]) -> dict[str, list[Any]]:
    """Column-wise view of the rows' extra columns (what reward functions receive).

    A column missing from some rows is passed as None there.
    """
    names: dict[str, None] = {}
    for r in rows:
        names.update(dict.fromkeys(r.columns))
    return {n: [r.columns.get(n) for r in rows] for n in names}


def check_columns(rows: Sequence[PromptRow], required: set[str], source: str) -> None:
    """Fail before training when a reward needs a column the data lacks."""
    for r in rows:
        missing = sorted(required - set(r.columns))
        if missing:
            raise UserError(
                f"{r.source or source}: the rewards need column(s) {', '.join(missing)}, "
                "which this row lacks"
            )
