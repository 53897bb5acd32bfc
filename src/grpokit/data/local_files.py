"""A light check of local text data files before `datasets` parses them.

`datasets` reads the data; this module only finds what it would report without a line number, or
read silently in a way nobody meant (a JSON array on a line of a .jsonl file becomes a `text`
column; a CSV row with one extra field shifts pandas' columns), and maps each row to the line it
starts on so that row errors name the file and line.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from grpokit.errors import UserError, read_utf8


def _no_rows(path: Path) -> UserError:
    return UserError(f"{path}: no prompts (the file has no rows)")


def _json_error(where: str, e: json.JSONDecodeError) -> UserError:
    return UserError(f"{where}: not valid JSON ({e.msg} at column {e.colno})")


def _object_or_error(value: Any, where: str, what: str) -> None:
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a JSON object {what}, got {type(value).__name__}")


def jsonl_row_lines(path: Path, text: str) -> list[int]:
    """The line of each row of a JSON Lines text: one JSON object per non-blank line."""
    lines = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise _json_error(where, e) from None
        _object_or_error(record, where, "per line")
        lines.append(lineno)
    return lines


def json_row_lines(path: Path, text: str) -> list[int] | None:
    """Rows of a .json file: an array of objects (no line per row: None), or JSON Lines."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # several documents: JSON Lines saved as .json
            return jsonl_row_lines(path, text)
        raise _json_error(f"{path}:{e.lineno}", e) from None
    if isinstance(document, dict):
        return [1]  # one object: one row
    if not isinstance(document, list):
        raise UserError(
            f"{path}: expected an array of JSON objects (or one object per line), "
            f"got {type(document).__name__}"
        )
    if not document:
        raise _no_rows(path)
    for i, item in enumerate(document):
        _object_or_error(item, f"{path}: array element {i + 1}", "")
    return None


def csv_row_lines(path: Path, text: str) -> tuple[list[str], list[int]]:
    """The header and the starting line of each row of a CSV text.

    Every row must have as many fields as the header: pandas would otherwise fill the missing
    ones with nothing, or take an extra first field as a row label and shift every column.
    """
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return [], []
        for i, name in enumerate(header):
            if not name.strip():
                raise UserError(f"{path}:1: column {i + 1} of the header has no name; name it")
            if header.index(name) != i:
                raise UserError(f"{path}:1: column {name!r} appears twice in the header")
        lines: list[int] = []
        previous = reader.line_num
        for row in reader:
            start = previous + 1
            previous = reader.line_num
            if not row:  # a blank line, skipped by pandas too
                continue
            if len(row) != len(header):
                raise UserError(
                    f"{path}:{start}: {len(row)} fields, but the header has {len(header)} "
                    f"({', '.join(header)}); quote a field that contains a comma"
                )
            lines.append(start)
    except csv.Error as e:
        raise UserError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None
    return header, lines


def precheck(path: Path, builder: str) -> tuple[list[str] | None, list[int] | None]:
    """Check a local text file that `datasets`' ``builder`` ("json" or "csv") will read.

    Returns:
        the CSV header (None for JSON) and the line each row starts on (None when rows are not
        lines, as in a JSON array).

    Raises:
        UserError: the file is not UTF-8, not valid JSON or CSV, has no rows, or a row is
            malformed; naming the file and line.
    """
    text = read_utf8(path)
    if not text.strip():
        raise _no_rows(path)
    header: list[str] | None = None
    lines: list[int] | None
    if builder == "csv":
        header, lines = csv_row_lines(path, text)
    elif path.suffix == ".jsonl":
        lines = jsonl_row_lines(path, text)
    else:
        lines = json_row_lines(path, text)
    if lines == []:
        raise _no_rows(path)
    return header, lines
