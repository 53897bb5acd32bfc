"""Checkpoint manifests: what a checkpoint holds, written last, and checked before anything loads.

``manifest.json`` lists every file of a checkpoint with its size and sha256, and for each
``.safetensors`` file the names, shapes and dtypes of its tensors (read from the file's header).
It is written after every other file, so a checkpoint with a manifest is complete; a file that
was truncated, emptied, replaced or deleted since is found and named before a byte of it is
loaded. Checkpoints written without a manifest (by earlier releases) are checked as far as their
files allow: every ``.safetensors`` header must parse and match the file's length, every JSON
file must parse.

The safetensors format: 8 bytes (little-endian header length N), N bytes of JSON mapping each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data that
follows), then the data.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.errors import UserError

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
"""The manifest's own layout version; a newer one is refused with a message."""

_MAX_HEADER = 100 << 20
"""A safetensors header longer than this is garbage, not a header (real ones are kilobytes)."""

_ITEM_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


class CheckpointDamaged(UserError):
    """A checkpoint file that is missing, unreadable or not what the checkpoint says it is.

    ``path`` is the file (or the checkpoint directory, when the problem is not one file's)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header declares it: dtype (e.g. ``F32``) and shape."""

    dtype: str
    shape: tuple[int, ...]


def safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a ``.safetensors`` file declares, after checking that the header parses and
    that the data it describes is exactly what the file holds (no truncation, no overlap).

    Raises:
        CheckpointDamaged: naming the file and what is wrong with it.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointDamaged(path, f"truncated ({size} bytes; not a safetensors file)")
            length = int.from_bytes(head, "little")
            if length > min(size - 8, _MAX_HEADER):
                raise CheckpointDamaged(
                    path,
                    f"not a safetensors file, or truncated (header of {length} bytes "
                    f"declared, file of {size} bytes)",
                )
            raw = f.read(length)
    except OSError as exc:
        raise CheckpointDamaged(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise CheckpointDamaged(path, "not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointDamaged(path, "not a safetensors file (its header is not a mapping)")
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        info, span = _tensor_entry(path, name, entry)
        tensors[name] = info
        spans.append((*span, name))
    data = size - 8 - length
    end = 0
    for begin, stop, name in sorted(spans):
        if begin < end:
            raise CheckpointDamaged(path, f"tensor {name!r} overlaps the one before it")
        end = stop
    if end != data:
        what = "truncated" if end > data else "longer than its tensors"
        raise CheckpointDamaged(
            path, f"{what}: its tensors take {end} bytes of data, the file holds {data}"
        )
    return tensors


def _tensor_entry(path: Path, name: str, entry: Any) -> tuple[TensorInfo, tuple[int, int]]:
    bad = CheckpointDamaged(path, f"tensor {name!r} has a malformed header entry")
    if not isinstance(entry, dict):
        raise bad
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not (
        isinstance(dtype, str)
        and dtype in _ITEM_BYTES
        and isinstance(shape, list)
        and all(isinstance(d, int) and d >= 0 for d in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise bad
    if offsets[1] - offsets[0] != math.prod(shape) * _ITEM_BYTES[dtype]:
        raise CheckpointDamaged(
            path, f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape} {dtype}"
        )
    return TensorInfo(dtype, tuple(shape)), (offsets[0], offsets[1])


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: Path, *, trainer_state_version: int | None = None) -> Path:
    """Describe every file under ``directory`` in ``directory/manifest.json``: call it after
    everything else is written (its presence says the checkpoint is complete)."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel == MANIFEST:
            continue
        entry: dict[str, Any] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
        if path.suffix == ".safetensors":
            entry["tensors"] = {
                name: {"dtype": t.dtype, "shape": list(t.shape)}
                for name, t in safetensors_header(path).items()
            }
        files[rel] = entry
    document = {
        "format": MANIFEST_FORMAT,
        "trainer_state_version": trainer_state_version,
        "files": files,
    }
    target = directory / MANIFEST
    target.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return target


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest: each file's size, sha256 and (safetensors) tensors."""

    files: dict[str, dict[str, Any]]
    trainer_state_version: int | None

    def tensors(self, rel: str) -> dict[str, TensorInfo]:
        listed = self.files.get(rel, {}).get("tensors") or {}
        return {n: TensorInfo(t["dtype"], tuple(t["shape"])) for n, t in listed.items()}


def read_manifest(directory: Path) -> Manifest | None:
    """The checkpoint's manifest, None when it has none (written by an earlier release)."""
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointDamaged(path, f"unreadable ({_short(exc)})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        raise CheckpointDamaged(path, "not a grpokit checkpoint manifest (no 'files' mapping)")
    fmt = doc.get("format")
    if not isinstance(fmt, int) or fmt > MANIFEST_FORMAT:
        raise CheckpointDamaged(
            path, f"format {fmt!r}: written by a newer grpokit; upgrade grpokit to read it"
        )
    version = doc.get("trainer_state_version")
    if version is not None and not isinstance(version, int):
        raise CheckpointDamaged(path, f"trainer_state_version {version!r} is not a number")
    files = doc["files"]
    for rel, entry in files.items():
        if (
            not (
                isinstance(entry, dict)
                and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)
                and isinstance(entry.get("tensors", {}), dict)
            )
            or Path(rel).is_absolute()
            or ".." in Path(rel).parts
        ):
            raise CheckpointDamaged(path, f"malformed entry for {rel!r}")
    return Manifest(files, version)


def verify_checkpoint(directory: Path, *, under: str = "") -> Manifest | None:
    """Check the files of a checkpoint (those whose path starts with ``under``, e.g. ``model/``)
    against its manifest: present, of the listed size and sha256, safetensors headers whole.
    Without a manifest, every safetensors header and JSON file there is checked instead.

    Returns the manifest (None without one). Raises :class:`CheckpointDamaged` naming the first
    damaged file and what is wrong with it.
    """
    manifest = read_manifest(directory)
    if manifest is None:
        root = directory / under if under else directory
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            check_file_format(path)
        return None
    for rel, entry in manifest.files.items():
        if not rel.startswith(under):
            continue
        path = directory / rel
        if not path.is_file():
            raise CheckpointDamaged(path, "missing (the checkpoint's manifest lists it)")
        size = path.stat().st_size
        if size != entry["size"]:
            change = "truncated" if size < entry["size"] else "grown"
            raise CheckpointDamaged(
                path, f"{change}: {size} bytes, the manifest says {entry['size']}"
            )
        if path.suffix == ".safetensors":
            found = safetensors_header(path)
            if found != manifest.tensors(rel):
                raise CheckpointDamaged(path, _tensor_difference(manifest.tensors(rel), found))
        if sha256_of(path) != entry["sha256"]:
            raise CheckpointDamaged(
                path, "its contents changed since it was written (sha256 differs from the manifest)"
            )
    return manifest


def _tensor_difference(listed: dict[str, TensorInfo], found: dict[str, TensorInfo]) -> str:
    for name, info in listed.items():
        got = found.get(name)
        if got is None:
            return f"tensor {name!r} is missing (the manifest lists it)"
        if got != info:
            return (
                f"tensor {name!r} is {got.dtype} {list(got.shape)}, the manifest says "
                f"{info.dtype} {list(info.shape)}"
            )
    extra = sorted(set(found) - set(listed))
    return f"tensor {extra[0]!r} is not in the manifest"


def check_file_format(path: Path) -> None:
    """What can be checked of a file without a manifest: a safetensors header that parses and
    matches the file's length; JSON that parses."""
    if path.suffix == ".safetensors":
        safetensors_header(path)
    elif path.suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CheckpointDamaged(path, f"not valid JSON ({_short(exc)})") from None


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 120 else text[:117] + "..."


def check_model(path: Path) -> None:
    """Check a model directory (a checkpoint's ``model/``, an SFT output, any saved model)
    before it loads: against its checkpoint's manifest when it has one, else every safetensors
    header and JSON file in it; and the files its kind needs are there.

    Raises:
        CheckpointDamaged: naming the damaged or missing file.
    """
    if path.name == "model" and (path.parent / MANIFEST).exists():
        verify_checkpoint(path.parent, under="model/")
    else:
        verify_checkpoint(path)
    if (path / "adapter_config.json").is_file():
        config, weights = "adapter_config.json", ["adapter_model.safetensors", "adapter_model.bin"]
    elif (path / "config.json").is_file():
        config, weights = (
            "config.json",
            ["model.safetensors", "*.safetensors", "pytorch_model*.bin"],
        )
    elif next(path.glob("adapter_model.*"), None) is not None:
        raise CheckpointDamaged(
            path / "adapter_config.json", "missing (the LoRA adapter's weights are there)"
        )
    else:
        raise CheckpointDamaged(
            path, "holds neither adapter_config.json (a LoRA adapter) nor config.json (a model)"
        )
    document = json.loads((path / config).read_text(encoding="utf-8"))  # checked above
    if not isinstance(document, dict):
        raise CheckpointDamaged(path / config, "not a JSON object")
    if not any(next(path.glob(pattern), None) for pattern in weights):
        raise CheckpointDamaged(path / weights[0], f"missing ({config} is there, no weights)")
