"""Prompt sets: what `datasets` reads (local files, folders, hub datasets), checked row by row.

Every column other than the prompt reaches the reward functions as a keyword argument (TRL's
convention), so a row is kept whole. Errors name the file and line (local JSON and CSV files) or
the row, and say what to fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit.data.sources import DatasetSource, read_records
from grpokit.errors import UserError

Prompt = str | list[dict[str, str]]

ROLES = ("system", "user", "assistant", "tool")
"""Chat roles a prompt's messages may have (those of TRL's conversational datasets)."""


@dataclass(frozen=True)
class PromptRow:
    """One prompt with the rest of its row. `source` is 'file:line' for messages."""

    prompt: Prompt
    columns: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def _check_messages(value: list[Any], where: str, column: str) -> list[dict[str, str]]:
    messages = []
    for i, msg in enumerate(value):
        if not (
            isinstance(msg, dict)
            and isinstance(msg.get("role"), str)
            and isinstance(msg.get("content"), str)
        ):
            raise UserError(
                f"{where}: message {i} of {column!r} must be "
                '{"role": "system"|"user"|"assistant", "content": "..."} with text content'
            )
        if msg["role"] not in ROLES:
            raise UserError(
                f"{where}: message {i} of {column!r} has role {msg['role']!r}; use one of "
                f"{', '.join(ROLES)} (ShareGPT's human/gpt are user/assistant)"
            )
        messages.append({"role": msg["role"], "content": msg["content"]})
    if not any(m["role"] == "user" for m in messages):
        raise UserError(
            f"{where}: the messages of {column!r} have no user message "
            f"(roles: {', '.join(m['role'] for m in messages)}); a prompt needs one to answer"
        )
    return messages


def _check_prompt(value: Any, where: str, column: str) -> Prompt:
    if isinstance(value, str):
        if not value.strip():
            raise UserError(f"{where}: column {column!r} is empty")
        return value
    if isinstance(value, list) and value:
        return _check_messages(value, where, column)
    raise UserError(
        f"{where}: column {column!r} must be a non-empty string or a list of chat messages, "
        f"got {type(value).__name__}"
    )


def _row(record: dict[str, Any], where: str, column: str) -> PromptRow:
    if record.get(column) is None:
        present = ", ".join(k for k, v in record.items() if v is not None) or "none"
        raise UserError(
            f"{where}: no {column!r} value (columns with values: {present}); set "
            "data.prompt_column, or rename a column with data.columns"
        )
    # A column missing from this row (None, as `datasets` fills it) is left out, so that a
    # reward that needs it is reported before training (check_columns).
    columns = {k: v for k, v in record.items() if k != column and v is not None}
    return PromptRow(_check_prompt(record[column], where, column), columns, where)


def load_prompts(
    path: str | Path | DatasetSource,
    *,
    prompt_column: str = "prompt",
    columns: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> list[PromptRow]:
    """Load a prompt set: anything `datasets.load_dataset` reads (see grpokit.data.sources).

    Args:
        path: a local file or folder, a hub dataset name, or a :class:`DatasetSource` with its
            config, split and revision.
        prompt_column: the column with the prompt, after renaming.
        columns: renames ``{dataset column: name}`` before anything reads the rows.
        base_dir: directory that relative paths resolve against (default: the working one).

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "p.jsonl")
    >>> _ = open(p, "w").write('{"prompt": "1+1?", "answer": "2"}\\n')
    >>> load_prompts(p)[0].columns
    {'answer': '2'}
    """
    source = path if isinstance(path, DatasetSource) else DatasetSource(str(path))
    records = read_records(source, base_dir=base_dir, columns=columns)
    if prompt_column not in records.column_names:
        raise UserError(
            f"{records.where(0)}: no {prompt_column!r} column "
            f"(columns: {', '.join(records.column_names)}); set data.prompt_column, or rename "
            f"a column with data.columns (e.g. columns: {{question: {prompt_column}}})"
        )
    return [_row(r, records.where(i), prompt_column) for i, r in enumerate(records.rows)]


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
