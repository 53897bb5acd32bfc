"""``grpokit export``: a trained checkpoint as a standalone Hugging Face directory or a GGUF file.

Both formats start from the same merged model: the checkpoint is loaded the way ``grpokit eval``
loads it (a LoRA adapter is merged into the weights it was trained on, warm starts included), so
what is exported is exactly what was evaluated.

- ``hf``: ``save_pretrained`` of the merged model and its tokenizer (chat template included); it
  loads with ``AutoModelForCausalLM.from_pretrained`` and no grpokit installed.
- ``gguf``: a file for llama.cpp (see :mod:`grpokit.models.gguf_export`), f32, f16, q8_0 or one of
  llama.cpp's k-quant mixes. When the model came from a GGUF file (the embedded default), that
  file's metadata is carried over.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from grpokit.errors import UserError
from grpokit.files import set_default_mode
from grpokit.models.gguf_export import GGUFType, check_outtype, write_gguf
from grpokit.models.loading import POLICY_FILE, DType

ExportFormat = Literal["hf", "gguf"]

EXPORT_FILE = "grpokit_export.json"
"""Written into an exported HF directory: where it came from (informational; nothing reads it to
load the model)."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint loaded for export: the merged model, its tokenizer and where it came from."""

    model: Any
    tokenizer: Any
    base_name_or_path: str
    init_from: str | None
    given: str
    label: str
    """A short name of what was loaded, e.g. ``myrun/checkpoint-24``."""


def load_merged(checkpoint: str, *, dtype: DType = "float32") -> LoadedCheckpoint:
    """Load ``checkpoint`` (a checkpoint-N/ or its model/, a run directory, a model directory or
    the embedded model's name) as one plain transformers model with any LoRA adapter merged."""
    from grpokit.models.checkpoints import resolve_model
    from grpokit.models.loading import load_policy

    spec = resolve_model(checkpoint, option="CHECKPOINT")
    policy = load_policy(
        spec.name_or_path,
        dtype=dtype,
        lora=None,
        need_reference=False,
        init_from=spec.init_from,
    )
    policy.model.eval()
    return LoadedCheckpoint(
        model=policy.model,
        tokenizer=policy.tokenizer,
        base_name_or_path=spec.name_or_path,
        init_from=spec.init_from,
        given=checkpoint,
        label=spec.label,
    )


def _policy_base(directory: Path) -> str | None:
    try:
        info = json.loads((directory / POLICY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    base = info.get("base_model") if isinstance(info, dict) else None
    return base if isinstance(base, str) and base else None


def origin_gguf(name_or_path: str, init_from: str | None = None) -> Path | None:
    """The GGUF file the checkpoint's weights were first converted from, if grpokit knows it.

    Follows the checkpoint's chain: the adapter's or full checkpoint's ``grpokit_policy.json``
    names its base model, and a directory converted from a GGUF (the embedded model) records its
    source file.
    """
    from grpokit.hub.embedded import source_gguf
    from grpokit.hub.named import named_model
    from grpokit.hub.resolve import resolve_model_path

    seen: set[str] = set()
    candidates = [p for p in (init_from, name_or_path) if p]
    while candidates:
        name = candidates.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if named_model(name) is not None:
            name = resolve_model_path(name)
        directory = Path(name).expanduser()
        if not directory.is_dir():
            continue
        found = source_gguf(directory)
        if found is not None:
            return found
        base = _policy_base(directory)
        if base is not None:
            candidates.append(base)
    return None


def _replace_dir(tmp: Path, out: Path) -> None:
    if out.exists():
        if not out.is_dir():
            raise UserError(f"--out {out} exists and is not a directory; choose another path.")
        stale = out.with_name(f".{out.name}.old-{os.getpid()}-{time.time_ns()}")
        os.rename(out, stale)
        os.rename(tmp, out)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.rename(tmp, out)


def export_hf(loaded: LoadedCheckpoint, out: Path) -> Path:
    """Write the merged model and its tokenizer as a Hugging Face directory (atomically)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        loaded.model.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)
        info = {
            "exported_from": loaded.given,
            "base_model": loaded.base_name_or_path,
            "adapter_merged": loaded.init_from,
        }
        (tmp / EXPORT_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        set_default_mode(tmp)  # mkdtemp's 0700 would keep the export from other accounts
        _replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def gguf_path(out: Path, outtype: GGUFType, label: str) -> Path:
    """The file to write: ``out`` itself, or ``<label>-<outtype>.gguf`` inside ``out`` when that
    is an existing directory."""
    if out.is_dir():
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-.") or "model"
        return out / f"{stem}-{outtype}.gguf"
    if out.suffix != ".gguf":
        raise UserError(f"--out {out}: a GGUF export is a file; give a path ending in .gguf.")
    return out


def export_checkpoint(
    checkpoint: str,
    *,
    fmt: ExportFormat,
    out: Path,
    outtype: GGUFType = "f16",
    dtype: DType = "float32",
    log: Callable[[str], None] = print,
) -> Path:
    """Export a checkpoint; returns the directory (hf) or file (gguf) written.

    Args:
        checkpoint: what to export (see :func:`load_merged`).
        fmt: ``hf`` or ``gguf``.
        out: the directory (hf) or ``.gguf`` file (gguf; an existing directory gets a file
            named after the checkpoint).
        outtype: GGUF tensor type, one of :data:`~grpokit.models.gguf_export.GGUF_TYPES`
            (``q4_k_m``, ``q5_k_m`` and ``q6_k`` need cyllama).
        dtype: weights' dtype of the HF export.
        log: where progress notes go.
    """
    return export_loaded(
        load_export_source(checkpoint, fmt=fmt, out=out, outtype=outtype, dtype=dtype),
        fmt=fmt,
        out=out,
        outtype=outtype,
        log=log,
    )


def load_export_source(
    checkpoint: str, *, fmt: ExportFormat, out: Path, outtype: GGUFType, dtype: DType
) -> LoadedCheckpoint:
    """The checkpoint loaded for :func:`export_loaded`, after the arguments are checked (a wrong
    format, type or ``out`` fails before the model loads). A GGUF is written from float32."""
    if fmt not in ("hf", "gguf"):
        raise UserError(f"--format {fmt}: use hf or gguf.")
    if fmt == "gguf":
        check_outtype(outtype)
        out = Path(out).expanduser()
        if not out.is_dir():
            gguf_path(out, outtype, "")
    return load_merged(checkpoint, dtype="float32" if fmt == "gguf" else dtype)


def export_loaded(
    loaded: LoadedCheckpoint,
    *,
    fmt: ExportFormat,
    out: Path,
    outtype: GGUFType = "f16",
    log: Callable[[str], None] = print,
) -> Path:
    """Write a loaded checkpoint (:func:`load_export_source`) as ``fmt``; returns the path."""
    out = Path(out).expanduser()
    if fmt == "gguf":
        target = gguf_path(out, outtype, loaded.label)
        source = origin_gguf(loaded.base_name_or_path, loaded.init_from)
        if source is not None:
            log(f"carrying the metadata of {source.name} over")
        return write_gguf(loaded.model, loaded.tokenizer, target, outtype=outtype, source=source,
                          log=log)  # fmt: skip
    return export_hf(loaded, out)
