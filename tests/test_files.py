"""grpokit.files: atomic writes give outputs the mode a plain write would, not tempfile's 0600."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpokit.files import current_umask, set_default_mode, write_atomic, write_json


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, under which a new file is readable by every account."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_current_umask_reads_the_umask_and_leaves_it() -> None:
    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027
        assert current_umask() == 0o027
    finally:
        os.umask(old)


def test_atomic_writes_are_readable_by_others_under_umask_022(
    umask_022: None, tmp_path: Path
) -> None:
    write_atomic(tmp_path / "report.html", "<p>hi</p>")
    write_json(tmp_path / "run.json", {"a": 1})
    assert mode(tmp_path / "report.html") == 0o644
    assert mode(tmp_path / "run.json") == 0o644
    # Replacing a file gives the new one the same mode.
    write_atomic(tmp_path / "report.html", b"<p>again</p>")
    assert mode(tmp_path / "report.html") == 0o644
    assert (tmp_path / "report.html").read_text() == "<p>again</p>"


def test_atomic_writes_follow_a_stricter_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "eval.json", "{}")
    finally:
        os.umask(old)
    assert mode(tmp_path / "eval.json") == 0o640


def test_set_default_mode_opens_tempfile_s_directories_as_mkdir_would(
    umask_022: None, tmp_path: Path
) -> None:
    made = Path(tempfile.mkdtemp(dir=tmp_path))
    assert mode(made) == 0o700
    set_default_mode(made)
    assert mode(made) == 0o755
    fd, name = tempfile.mkstemp(dir=tmp_path)
    os.close(fd)
    set_default_mode(Path(name))
    assert mode(Path(name)) == 0o644
