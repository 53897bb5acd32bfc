"""A GGUF causal LM converted once into a trainable transformers directory in grpokit's cache.

transformers reads a GGUF, but the model it returns is flagged as quantised and cannot be trained.
Every GGUF grpokit trains (the embedded default, a named offline model, a user's own file) is
therefore dequantised to float32 once, saved without the quantisation config (tokenizer and chat
template included) into ``<cache>/models/<name>``, and loaded from there. The directory appears
complete or not at all: written beside its place, then renamed; a marker file written last
records where the weights came from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpokit.errors import UserError
from grpokit.files import cache_root, set_default_mode
from grpokit.hub.gguf_header import read_header

MARKER_FILE = "grpokit_source.json"
"""Written last into a converted directory; it records where the weights came from (the GGUF path
is what a GGUF export needs to carry the original metadata over)."""

# Bumped when the conversion changes what it writes for a file it already converted, so an older
# cached directory is rebuilt instead of used.
CONVERSION_FORMAT = 1

TIED_TOLERANCE = 0.25
"""Largest relative difference ``||head - embeddings|| / ||embeddings||`` at which a GGUF's
separate output head is taken for a quantised copy of the embeddings. llama.cpp's quantiser writes
a tied model's head as a tensor of its own when it quantises the two differently (the
Qwen2.5-Coder-0.5B file: embeddings Q5_0, head Q8_0, relative difference 0.044); two matrices
trained apart differ by about sqrt(2)."""


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """The provenance record of a converted directory, or None if it is absent or unreadable."""
    try:
        data = json.loads((model_dir / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_complete(model_dir: Path) -> bool:
    """Whether ``model_dir`` is a finished conversion of the current format."""
    marker = read_marker(model_dir)
    return (
        marker is not None
        and marker.get("format") == CONVERSION_FORMAT
        and (model_dir / "config.json").is_file()
    )


def _bits_per_weight(gguf_path: Path, names: tuple[str, ...]) -> dict[str, float]:
    """Bits per weight of the named tensors as the file stores them."""
    import gguf

    types = read_header(gguf_path).tensor_types
    out: dict[str, float] = {}
    for name in names:
        if name in types:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(types[name])]
            out[name] = 8.0 * size / block
    return out


def tie_if_tied_at_source(model: Any, bits: dict[str, float]) -> bool:
    """Tie the output head to the embeddings again where the GGUF holds a quantised copy of them.

    A tied model whose head llama.cpp quantised apart from its embeddings comes out of
    transformers with two matrices (Qwen2.5-Coder-0.5B: 630M parameters instead of 494M), which
    would then train apart. Where the two are the same matrix up to quantisation (see
    :data:`TIED_TOLERANCE`), the more precisely stored of the two (``bits``: bits per weight of
    the file's ``output.weight`` and ``token_embd.weight``) becomes the one shared matrix.
    Returns whether it tied.
    """
    import torch

    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embeddings is None or head.weight is embeddings.weight:
        return False
    if head.weight.shape != embeddings.weight.shape:
        return False
    with torch.no_grad():
        gap = float((head.weight - embeddings.weight).norm() / embeddings.weight.norm())
        if gap > TIED_TOLERANCE:
            return False
        if bits.get("output.weight", 0.0) > bits.get("token_embd.weight", 0.0):
            embeddings.weight.copy_(head.weight)
    model.config.get_text_config().tie_word_embeddings = True
    model.config.tie_word_embeddings = True
    head.weight = embeddings.weight
    return True


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF causal LM to float32 and save it as a plain transformers directory.

    ``out_dir`` is written in place (callers that need atomicity pass a temporary directory). The
    saved config carries no quantisation config, so the result loads as an ordinary trainable
    model; a head stored as a quantised copy of the embeddings is tied to them again. The marker
    file is written last.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    with gguf_path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise UserError(f"{gguf_path} is not a GGUF file (it does not start with 'GGUF').")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model: Any = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32
        )
    except (ValueError, KeyError, IndexError, OSError, NotImplementedError, struct.error) as exc:
        raise UserError(
            f"{gguf_path}: transformers cannot turn this GGUF into a trainable model ({exc}); "
            "a damaged or truncated file says so too. "
            "Give a model of an architecture transformers reads from GGUF (Llama, Mistral, "
            "Qwen2/3, Gemma 2/3, Phi-3, GPT-2, ...), or its Hugging Face directory."
        ) from exc
    # The weights are already dequantised; these flags only make save_pretrained refuse the model
    # (or write a quantisation config that makes later loads quantised again).
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tied = tie_if_tied_at_source(
        model, _bits_per_weight(gguf_path, ("output.weight", "token_embd.weight"))
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    marker = {
        "format": CONVERSION_FORMAT,
        "gguf_path": str(gguf_path.resolve()),
        "gguf_size": gguf_path.stat().st_size,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "head_tied_again": tied,
    }
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
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


def models_dir(cache_dir: Path | None = None) -> Path:
    """``<cache>/models``, created if needed (a clear error where it cannot be)."""
    models = (cache_dir if cache_dir is not None else cache_root()) / "models"
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"Cannot create the model cache directory {models}: {exc}. "
            "Set GRPOKIT_CACHE to a writable directory."
        ) from exc
    return models


def converted_dir(
    name: str, gguf_path: Path, *, what: str, about: str, cache_dir: Path | None = None
) -> Path:
    """``<cache>/models/<name>``, converted from ``gguf_path`` on first use.

    Args:
        name: the directory's name in the cache.
        gguf_path: the file to convert (read only when the directory is missing).
        what: how the one-line message names the model ("the embedded model smollm2-135m-...").
        about: the expected time, for that message ("about 30 s").
        cache_dir: the grpokit cache root; default ``$GRPOKIT_CACHE`` or ``~/.cache/grpokit``.
    """
    target = (cache_dir if cache_dir is not None else cache_root()) / "models" / name
    if is_complete(target):
        return target
    models = models_dir(cache_dir)
    with exclusive_lock(models / f".{name}.lock"):
        if is_complete(target):  # another process finished while we waited
            return target
        print(
            f"grpokit: converting {what} from {gguf_path.name} into {target} (once per machine, "
            f"{about}) ...",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=models))
        try:
            convert_gguf(gguf_path, tmp)
            set_default_mode(tmp)  # the cache is shared by every account's runs on the machine
            replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(
            f"grpokit: {name} ready in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return target


def gguf_model_dir(path: Path, cache_dir: Path | None = None) -> Path:
    """The converted directory of any GGUF file a user gives, converting it on first use.

    Cached under a name made of the file's stem and a key of its full path, size and
    modification time, so a changed file is converted again and two files never share a
    directory.
    """
    path = path.expanduser().resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-.")[:60] or "model"
    minutes = max(1, round(stat.st_size / 300e6))  # measured: 491 MB in about 1.5 min on 2 cores
    return converted_dir(
        f"gguf-{stem}-{key}",
        path,
        what=f"the GGUF file {path}",
        about=f"about {minutes} min for its size",
        cache_dir=cache_dir,
    )


def replace_dir(src: Path, dst: Path) -> None:
    """Move the finished directory ``src`` to ``dst`` atomically; an existing incomplete ``dst``
    (an older conversion format, a manual copy) is moved aside first and then deleted."""
    if dst.exists():
        if is_complete(dst):
            return
        stale = dst.with_name(f".{dst.name}.stale-{os.getpid()}-{time.time_ns()}")
        os.rename(dst, stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(src, dst)
    except OSError:
        # Another process without the lock won the race; its directory is complete (it is only
        # ever created by a rename of a finished one), so use it.
        if not is_complete(dst):
            raise
