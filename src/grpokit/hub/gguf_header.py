"""A GGUF file's header, read without mapping the file: its metadata and its tensors' types.

``gguf.GGUFReader`` maps the whole file and builds a numpy view per value: over a tokenizer's
hundred thousand strings that takes seconds (about 5 s of CPU for the embedded model's file),
where a sequential read of the header takes a fraction of one. Conversion asks for the tensors'
types, the GGUF export for the source's metadata.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.errors import UserError

# Value types of the gguf format (gguf.GGUFValueType), by number, so that signatures here do not
# need the gguf package at import time.
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9

_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


@dataclass(frozen=True)
class KV:
    """One GGUF metadata entry. ``vtype`` / ``sub_type`` are gguf.GGUFValueType numbers."""

    key: str
    value: Any
    vtype: int
    sub_type: int | None = None


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file says before its tensor data."""

    metadata: dict[str, KV]
    tensor_types: dict[str, int]
    """Each tensor's name and its ggml type number (gguf.GGMLQuantizationType)."""


class _HeaderReader:
    """Sequential little-endian reads over a GGUF header held in memory."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.scalar("<Q")
        if self.pos + size > len(self.data):
            raise struct.error("string past the end of the data read")
        raw = self.data[self.pos : self.pos + size]
        self.pos += size
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            sub, count = self.scalar("<I"), self.scalar("<Q")
            return [self.value(sub) for _ in range(count)]
        if vtype not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.scalar(_SCALARS[vtype])

    def tensor_type(self) -> tuple[str, int]:
        """One tensor's entry: its name and type (its shape and offset are skipped)."""
        name = self.string()
        dims = self.scalar("<I")
        self.pos += 8 * dims
        kind = self.scalar("<I")
        self.pos += 8  # the data offset
        return name, kind


def read_header(path: Path) -> GGUFHeader:
    """The metadata and tensor types of a GGUF file (version 2 or 3), no tensor data read.

    Raises:
        UserError: not a GGUF file, an unsupported version, or a header cut short.
    """
    with open(path, "rb") as handle:
        head = handle.read(24)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise UserError(f"{path} is not a GGUF file (no GGUF magic number).")
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", head, 4)
        if version not in (2, 3):
            raise UserError(f"{path}: GGUF version {version} is not supported (2 and 3 are).")
        # The header sits before the tensor data; read in growing chunks until it parses.
        size = 1 << 22
        while True:
            handle.seek(24)
            data = handle.read(size)
            reader = _HeaderReader(data)
            try:
                metadata: dict[str, KV] = {}
                for _ in range(kv_count):
                    key = reader.string()
                    vtype = reader.scalar("<I")
                    sub = None
                    if vtype == ARRAY:
                        sub = struct.unpack_from("<I", data, reader.pos)[0]
                    metadata[key] = KV(key, reader.value(vtype), vtype, sub)
                types = dict(reader.tensor_type() for _ in range(tensor_count))
                return GGUFHeader(metadata, types)
            except struct.error:
                if len(data) < size:
                    raise UserError(f"{path}: the GGUF header is truncated.") from None
                size *= 4


def read_metadata(path: Path) -> dict[str, KV]:
    """Every metadata entry of a GGUF file (see :func:`read_header`)."""
    return read_header(path).metadata
