"""Loading models and tokenizers, the embedded default model, LoRA.

Names are imported lazily so that ``import grpokit.models`` does not pull in transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EMBEDDED_MODEL": "grpokit.model_files.embedded",
    "embedded_model_dir": "grpokit.model_files.embedded",
    "find_embedded_gguf": "grpokit.model_files.embedded",
    "source_gguf": "grpokit.model_files.embedded",
    "convert_gguf": "grpokit.model_files.embedded",
    "LoraSettings": "grpokit.models.loading",
    "Policy": "grpokit.models.loading",
    "load_policy": "grpokit.models.loading",
    "load_tokenizer": "grpokit.model_files.resolve",
    "resolve_model_path": "grpokit.model_files.resolve",
    "make_tiny_model_dir": "grpokit.models.tiny",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grpokit.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
