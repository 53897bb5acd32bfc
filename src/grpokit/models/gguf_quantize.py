"""llama.cpp's own quantiser on a GGUF file, through llama-cpp-python (an optional dependency).

The k-quant mixes (q4_k_m, q5_k_m, q6_k) are what llama.cpp's ``llama-quantize`` writes: llama.cpp
picks a type per tensor (q4_k_m stores the attention value and feed-forward down projections of
some layers at q6_K, for instance). grpokit writes an f16 file and lets llama.cpp quantise it,
rather than reimplementing those choices.

k-quants store rows in blocks of 256 values. A tensor whose rows are not a multiple of 256 long
(only tiny models have such widths) is stored by llama.cpp in a 32-value type instead (q5_0 for
q4_K, q5_1 for q5_K, q8_0 for q6_K), or f16 when the width is not a multiple of 32 either; the
export notes how many tensors fell back.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from grpokit.errors import UserError

QUANTIZED_TYPES: dict[str, str] = {
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
}
"""Output types made by llama.cpp's quantiser, with the llama_cpp constant of each file type."""

OUTTYPE_OPTION = "--outtype/--quantize"
"""How ``grpokit export`` spells the output type option, for messages."""

# ggml log levels (enum ggml_log_level): warnings and errors are kept for the user; CONT continues
# the previous message.
_LOG_WARN, _LOG_ERROR, _LOG_CONT = 2, 3, 5


def require_llama_cpp(outtype: str) -> Any:
    """The ``llama_cpp`` module, or :class:`UserError` saying how to get it for ``outtype``."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise UserError(
            f"{OUTTYPE_OPTION} {outtype}: quantising to {outtype} runs llama.cpp's quantiser, which "
            "comes with llama-cpp-python; install it (pip install llama-cpp-python) or choose "
            "f16 or q8_0, which grpokit writes itself."
        ) from exc
    return llama_cpp


@contextlib.contextmanager
def _llama_log_kept(llama_cpp: Any, kept: list[str]) -> Iterator[None]:
    """Route llama.cpp's log into ``kept`` (warnings and errors only) while the block runs, then
    give it back to the callback that had it."""
    previous = llama_cpp.llama_log_callback()
    previous_data = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(previous), ctypes.byref(previous_data))
    state = {"keep": False}

    def receive(level: int, text: bytes | None, _data: ctypes.c_void_p) -> None:
        if level != _LOG_CONT:
            state["keep"] = level in (_LOG_WARN, _LOG_ERROR)
        if state["keep"] and text:
            kept.append(text.decode("utf-8", errors="replace"))

    callback = llama_cpp.llama_log_callback(receive)  # referenced until restored below
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    try:
        yield
    finally:
        llama_cpp.llama_log_set(previous, previous_data)


def quantize_gguf(
    source: Path, target: Path, outtype: str, *, log: Callable[[str], None] = print
) -> None:
    """Quantise the f16/f32 GGUF ``source`` into ``target`` as llama.cpp's ``outtype`` mix.

    Raises :class:`UserError` when llama-cpp-python is missing or llama.cpp refuses the file
    (with llama.cpp's own message).
    """
    if outtype not in QUANTIZED_TYPES:
        raise UserError(
            f"{OUTTYPE_OPTION} {outtype}: llama.cpp quantises to {', '.join(QUANTIZED_TYPES)}."
        )
    llama_cpp = require_llama_cpp(outtype)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(getattr(llama_cpp, QUANTIZED_TYPES[outtype]))
    kept: list[str] = []
    with _llama_log_kept(llama_cpp, kept):
        status = llama_cpp.llama_model_quantize(
            str(source).encode(), str(target).encode(), ctypes.byref(params)
        )
    lines = [line.strip() for line in "".join(kept).splitlines() if line.strip()]
    if status != 0:
        detail = "; ".join(lines[-3:]) or f"status {status}"
        raise UserError(
            f"{OUTTYPE_OPTION} {outtype}: llama.cpp could not quantise the model: {detail}"
        )
    fallbacks = [line for line in lines if "falling back" in line]
    if fallbacks:
        log(
            f"{outtype}: {len(fallbacks)} tensor(s) have rows that are not a multiple of 256 "
            "long and are stored in another type, e.g. "
            + " ".join(fallbacks[0].removeprefix("warning:").split())
        )
