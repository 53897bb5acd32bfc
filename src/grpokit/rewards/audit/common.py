"""What the audits share: the completions file they read, the reward entry they audit, and how
they print a figure.

A completions file is JSONL, one object per line: ``completion`` (a string or chat messages) is
required, ``prompt`` optional, every other key a dataset column handed to the rewards.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from grpokit.errors import UserError
from grpokit.rewards._base import Reward
from grpokit.rewards.spec import RewardSpec

R = TypeVar("R", bound=Reward)
T = TypeVar("T")


def read_utf8(path: Path) -> str:
    """The text of a UTF-8 file, without the byte-order mark some Windows editors write.

    Raises:
        UserError: the file is not UTF-8, naming the byte offset and line of the first byte
            that is not (e.g. a latin-1 é saved by an old editor).
    """
    data = path.read_bytes()
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = bom + exc.start
        line = data.count(b"\n", 0, offset) + 1
        raise UserError(
            f"{path}: not UTF-8 text: byte 0x{data[offset]:02x} at byte offset {offset} "
            f"(line {line}): {exc.reason}. Save the file as UTF-8 (e.g. `iconv -f latin1 -t "
            "utf-8`)."
        ) from None


def read_numbered_completions(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Rows of a completions JSONL file with their line numbers; errors name the file and line.

    Raises:
        UserError: missing or non-UTF-8 file, a line that is not a JSON object, or one without
            ``completion``.
    """
    if not path.is_file():
        raise UserError(f"completions file {path} does not exist")
    rows: list[tuple[int, dict[str, Any]]] = []
    # split("\n"), not splitlines(): JSON text may hold U+2028 and other characters that
    # splitlines() also breaks at.
    for number, line in enumerate(read_utf8(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise UserError(f"{path}:{number}: not valid JSON: {exc}") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{number}: each line must be a JSON object")
        if "completion" not in row:
            raise UserError(
                f"{path}:{number}: no `completion` key; each line needs at least "
                '{"completion": "..."}'
            )
        rows.append((number, row))
    if not rows:
        raise UserError(f"{path} holds no completions (one JSON object per line)")
    return rows


def read_completions(path: Path) -> list[dict[str, Any]]:
    """Rows of a completions JSONL file (see :func:`read_numbered_completions`)."""
    return [row for _, row in read_numbered_completions(path)]


def pick_reward(
    specs: list[RewardSpec], type_name: str, name: str | None, *, source: str
) -> RewardSpec:
    """The ``rewards:`` entry of type ``type_name`` a command works on: the one named ``name``,
    or the only one of that type.

    Raises:
        UserError: ``source`` (the config) has none, none of that name, or several and no name.
    """
    entries = [s for s in specs if s.type == type_name]
    names = [s.display_name for s in entries]
    if not entries:
        raise UserError(f"{source}: the rewards: list has no entry of type {type_name} to audit")
    if name is not None:
        if name not in names:
            raise UserError(
                f"{source}: no {type_name} reward named {name!r}; {type_name} rewards: "
                f"{', '.join(names)}"
            )
        return entries[names.index(name)]
    if len(entries) > 1:
        raise UserError(
            f"{source} has several {type_name} rewards ({', '.join(names)}); pick one with --reward"
        )
    return entries[0]


def format_tags(specs: list[RewardSpec]) -> list[str] | None:
    """The tags of the config's xml_format reward (planted answers wear them, so that a format
    gate lets them through to the reward under audit), or None without one."""
    for spec in specs:
        if spec.type == "xml_format":
            return [str(t) for t in getattr(spec.params, "tags", [])]
    return None


def audit_config_reward(
    specs: list[RewardSpec],
    type_name: str,
    reward_name: str | None,
    completions_path: Path,
    *,
    source: str,
    build: Callable[[RewardSpec], R],
    audit: Callable[[R, list[dict[str, Any]], str, list[str] | None], T],
) -> T:
    """How every audit runs on a config: pick the ``rewards:`` entry of ``type_name``
    (:func:`pick_reward`), read the completions file, ``build`` that reward once, then
    ``audit(reward, rows, name, format_tags)``; the reward is closed whatever happens.

    The checks run in that order, so a config without such a reward is reported before a
    missing completions file, and neither loads a model.
    """
    spec = pick_reward(specs, type_name, reward_name, source=source)
    rows = read_completions(completions_path)
    reward = build(spec)
    try:
        return audit(reward, rows, spec.display_name, format_tags(specs))
    finally:
        reward.close()


def fmt(value: float | None, digits: int = 3) -> str:
    """A figure for a table: ``digits`` decimals, "-" for None or NaN."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"
