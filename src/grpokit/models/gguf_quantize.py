"""llama.cpp's own quantiser on a GGUF file (through cyllama, an optional dependency; see
:mod:`grpokit.models.gguf_runtime`).

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

from collections.abc import Callable
from pathlib import Path

from grpokit.errors import UserError
from grpokit.models import gguf_runtime

QUANTIZED_TYPES: dict[str, int] = {
    "q4_k_m": 15,  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    "q5_k_m": 17,  # LLAMA_FTYPE_MOSTLY_Q5_K_M
    "q6_k": 18,  # LLAMA_FTYPE_MOSTLY_Q6_K
}
"""Output types made by llama.cpp's quantiser, with each one's file type (llama.h's enum
llama_ftype, stored as ``general.file_type``)."""

OUTTYPE_OPTION = "--outtype/--quantize"
"""How ``grpokit export`` spells the output type option, for messages."""


def require_llama_cpp(outtype: str) -> None:
    """:class:`UserError` saying how to get llama.cpp's quantiser for ``outtype`` when it is
    missing (checked before an export does any work)."""
    try:
        gguf_runtime.require_cyllama(f"{OUTTYPE_OPTION} {outtype}: quantising to {outtype}")
    except UserError as exc:
        raise UserError(f"{exc}, or choose f16 or q8_0, which grpokit writes itself.") from exc


def quantize_gguf(
    source: Path, target: Path, outtype: str, *, log: Callable[[str], None] = print
) -> None:
    """Quantise the f16/f32 GGUF ``source`` into ``target`` as llama.cpp's ``outtype`` mix.

    Raises :class:`UserError` when cyllama is missing or llama.cpp refuses the file (with
    llama.cpp's own message).
    """
    if outtype not in QUANTIZED_TYPES:
        raise UserError(
            f"{OUTTYPE_OPTION} {outtype}: llama.cpp quantises to {', '.join(QUANTIZED_TYPES)}."
        )
    require_llama_cpp(outtype)
    done, lines = gguf_runtime.quantize(source, target, QUANTIZED_TYPES[outtype])
    if not done:
        detail = "; ".join(lines[-3:]) or "no message"
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
