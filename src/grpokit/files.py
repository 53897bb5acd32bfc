"""Writing files so that a crash never leaves half of one: a temporary file beside the target,
then a rename (atomic on one file system); and where grpokit keeps its cache."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """The grpokit cache directory (converted models, compiled kernels): ``$GRPOKIT_CACHE`` or
    ``~/.cache/grpokit``."""
    env = os.environ.get("GRPOKIT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "grpokit"


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path``: the old file or the whole new one, never a
    part. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    """Records as JSON lines, atomically; values JSON cannot hold are written as their text."""
    lines = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
    return write_atomic(path, lines)


def write_json(path: Path, document: Any) -> Path:
    """A JSON document, indented, atomically."""
    return write_atomic(path, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
