"""The one exception type for mistakes a user can fix (bad config, data, paths, servers)."""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """A problem in the user's input, stated so they can fix it.

    The CLI prints the message (no traceback) and exits with code 2. The message should name the
    file, line or field, say what is wrong, and what to do.
    """


class RunFailed(Exception):
    """A run that started and then failed (a reward raised, out of memory, a full disk ...).

    The message says what failed, what was saved and the command that resumes. The CLI prints
    it and exits with code 1 (``--debug`` or ``GRPOKIT_DEBUG=1`` adds the traceback of the
    cause); code 2 stays for bad input found before the run started.
    """


class RunStopped(Exception):
    """A run stopped on request (SIGINT, SIGTERM) after saving; exit code 128 + the signal."""

    def __init__(self, message: str, signal_number: int) -> None:
        super().__init__(message)
        self.signal_number = signal_number


def decode_utf8(data: bytes, source: str | Path) -> str:
    """``data`` decoded as UTF-8 (a leading byte-order mark dropped, as Excel writes one).

    Raises:
        UserError: naming ``source``, the byte offset and line of the first byte that is not
            UTF-8, and how to fix it; for "café" saved as Latin-1 in a.txt:
            "a.txt: not UTF-8 text: byte 0xe9 at offset 3 (line 1); save the file as UTF-8 ...".
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(
            f"{source}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
            f"(line {line}); save the file as UTF-8 (it looks like another encoding, "
            "such as Latin-1 or Windows-1252)"
        ) from None


def read_utf8(path: Path) -> str:
    """The text of a UTF-8 file; see :func:`decode_utf8` for the error it raises."""
    return decode_utf8(path.read_bytes(), path)
