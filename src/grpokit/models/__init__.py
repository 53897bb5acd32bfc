"""Loading models and tokenizers, the embedded default model, LoRA.

Names are imported lazily so that ``import grpokit.models`` does not pull in transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EMBEDDED_MODEL": "grpokit.hub.embedded",
    "embedded_model_dir": "grpokit.hub.embedded",
    "find_embedded_gguf": "grpokit.hub.embedded",
    "source_gguf": "grpokit.hub.embedded",
    "convert_gguf": "grpokit.hub.embedded",
    "LoraSettings": "grpokit.models.loading",
    "Policy": "grpokit.models.loading",
    "load_policy": "grpokit.models.loading",
    "load_tokenizer": "grpokit.hub.resolve",
    "resolve_model_path": "grpokit.hub.resolve",
    "make_tiny_model_dir": "grpokit.models.tiny",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grpokit.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
