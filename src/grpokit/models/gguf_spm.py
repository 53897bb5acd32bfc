"""SentencePiece-style BPE tokenizers (Gemma, Llama 2, Phi-3, Mistral 7B) as llama.cpp's ``llama``
vocabulary.

Such a tokenizer.json (a BPE model with byte fallback, spaces replaced by "▁", no byte-level
pre-tokenization) came from a SentencePiece model. llama.cpp's ``llama`` vocabulary reproduces
SentencePiece's BPE: it replaces spaces by "▁", optionally prepends one, splits the text into
characters, then repeatedly joins the adjacent pair whose join is a token with the highest
*score*, leftmost first; characters left without a token become ``<0xXX>`` byte tokens.

transformers' conversion writes, for every token, all its splits into two tokens as merges,
ordered by the SentencePiece score of the token they make. So BPE with those merges joins the
same pairs in the same order as llama.cpp does when each token's score falls with the rank of its
first merge: the scores written here are minus that rank. (The original SentencePiece scores are
not in tokenizer.json; llama.cpp only compares scores, so any scores in the same order do.)

Settings llama.cpp does not reproduce are refused: normalisers other than the space replacement
and prefix, and a prefix added only before the first piece of text (Metaspace's ``first``
scheme): llama.cpp adds it after every special token too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpokit.errors import UserError

SPACE = "▁"
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


@dataclass(frozen=True)
class SentencePieceStyle:
    """What llama.cpp's ``llama`` vocabulary needs to know about such a tokenizer."""

    add_space_prefix: bool
    """Whether "▁" is prepended to the text (Llama 2), or not (Gemma)."""


def _steps(node: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [step for child in node.get(key) or [] for step in _steps(child, key)]
    return [node]


def _pattern(step: Mapping[str, Any]) -> str | None:
    pattern = step.get("pattern") or {}
    value = pattern.get("String") if isinstance(pattern, dict) else None
    return None if value is None else str(value)


def sentencepiece_style(spec: Mapping[str, Any], tokenizer_name: str) -> SentencePieceStyle | None:
    """The settings of a SentencePiece-style BPE tokenizer.json, None for any other tokenizer.

    Raises:
        UserError: naming the tokenizer, when it is SentencePiece-style but with steps llama.cpp
            does not reproduce.
    """
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        return None
    normalizers = _steps(spec.get("normalizer"), "normalizers")
    pre_tokenizers = _steps(spec.get("pre_tokenizer"), "pretokenizers")
    if any(step.get("type") == "ByteLevel" for step in pre_tokenizers):
        return None
    replaces = False
    prefix = False
    unsupported: list[str] = []
    for step in normalizers:
        kind = step.get("type")
        if kind == "Replace" and _pattern(step) == " " and step.get("content") == SPACE:
            replaces = True
        elif kind == "Prepend" and step.get("prepend") == SPACE:
            prefix = True
        else:
            unsupported.append(f"normaliser {kind}")
    for step in pre_tokenizers:
        kind = step.get("type")
        if kind == "Metaspace" and step.get("replacement", SPACE) == SPACE:
            replaces = True
            scheme = step.get("prepend_scheme")
            if scheme is None:  # the older format's flag
                scheme = "always" if step.get("add_prefix_space", True) else "never"
            if scheme == "first":
                unsupported.append(
                    "Metaspace prepend_scheme 'first' (llama.cpp also prepends '▁' after every "
                    "special token)"
                )
            prefix = prefix or scheme != "never"
            if step.get("split", False):
                unsupported.append("Metaspace split")
        elif kind == "Split" and _pattern(step) == " " and replaces:
            continue  # Gemma's: after the normaliser there is no space left to split at
        else:
            unsupported.append(f"pre-tokenizer {kind}")
    if not replaces:
        unsupported.append("spaces not replaced by '▁'")
    if unsupported:
        raise UserError(
            f"GGUF export: the tokenizer of {tokenizer_name} is a SentencePiece-style BPE "
            f"tokenizer with {'; '.join(unsupported)}, which llama.cpp's SentencePiece "
            "tokenizer does not reproduce. Export with --format hf and convert the directory "
            "with llama.cpp's convert_hf_to_gguf.py."
        )
    return SentencePieceStyle(add_space_prefix=prefix)


def merge_scores(merges: Sequence[str | Sequence[str]], tokens: Sequence[str]) -> list[float]:
    """Per token, minus the rank of the first merge that makes it; tokens no merge makes
    (characters, bytes, special tokens) score below every merge, so that llama.cpp, which joins
    any pair that spells a token, prefers every real merge to them.

    Args:
        merges: the BPE merges in rank order, as "a b" strings or [a, b] pairs.
        tokens: the vocabulary by id.
    """
    first: dict[str, int] = {}
    for rank, merge in enumerate(merges):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        first.setdefault(left + right, rank)
    last = -float(len(merges))
    return [-float(first[t]) if t in first else last for t in tokens]


def is_byte_token(token: str) -> bool:
    """``<0x0A>`` and the like: the byte-fallback tokens."""
    return bool(_BYTE_TOKEN.match(token))
