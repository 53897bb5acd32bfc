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


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc``, since 4.7)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # Elsewhere the only way is to set it and set it back; the probe value is the strict 077, so
    # that a file another thread creates meanwhile is at worst private, never more open.
    old = os.umask(0o077)
    os.umask(old)
    return old


def set_default_mode(path: Path) -> None:
    """Give ``path``, made by :mod:`tempfile` (mode 0600 for a file, 0700 for a directory: private
    to its owner), the mode a plain ``open`` or ``mkdir`` would have given it, 0666 or 0777 less
    the umask. Without this, an output renamed into place from a temporary one (a report, a
    GGUF file, a checkpoint) could not be read by another account even under umask 022."""
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~current_umask())


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path``: the old file or the whole new one, never a
    part, with the mode a plain write gives a new file (0666 less the umask). Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        set_default_mode(Path(tmp))
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
