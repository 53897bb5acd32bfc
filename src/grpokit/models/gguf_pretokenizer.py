"""Which llama.cpp pre-tokenizer a Hugging Face byte-level BPE tokenizer needs.

Before applying BPE merges, a tokenizer cuts text into pieces (words, numbers, punctuation and
whitespace runs). llama.cpp does not read the tokenizer's rule from the file: it has a fixed set
of rules, and a GGUF names one in ``tokenizer.ggml.pre``. A wrong name makes llama.cpp cut digits,
contractions or newlines differently from the tokenizer the model was trained with, so the
model sees token sequences it never saw in training.

llama.cpp's converter recognises a tokenizer by hashing the token ids it gives for a fixed probe
text and looking the hash up among tokenizers it has downloaded, so it needs the hub and knows
only the tokenizers it has seen. Here the rule is read from the tokenizer itself (its
tokenizer.json as transformers loads it): the regular expressions its pre-tokenizer splits with,
in order, and the BPE ``ignore_merges`` flag (a piece that is itself in the vocabulary is one
token, merges or not). Those are what each of llama.cpp's named rules reproduces, so a rule
listed in :data:`PRE_TOKENIZERS` gives llama.cpp's tokens for any text; anything else is refused.

A Unicode NFC normaliser (Qwen2's) is accepted: llama.cpp does not normalise, which only matters
for text that is not already in NFC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpokit.errors import UserError

# The regular expression ByteLevel(use_regex=True) splits with (GPT-2's), and Digits(individual)'s.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
DIGIT_PATTERN = r"\p{N}"
# Split patterns as the families' tokenizer.json files write them.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """One of llama.cpp's named pre-tokenizers and the tokenizer settings it reproduces."""

    name: str
    """The value of ``tokenizer.ggml.pre``."""
    families: str
    """Model families whose tokenizers use it (for messages)."""
    splits: tuple[str, ...]
    """The regular expressions text is split with, in order (each match kept as a piece)."""
    ignore_merges: bool
    """Whether a piece found whole in the vocabulary is one token without applying merges."""


PRE_TOKENIZERS: tuple[PreTokenizer, ...] = (
    PreTokenizer("llama-bpe", "Llama 3", (LLAMA3_PATTERN,), ignore_merges=True),
    PreTokenizer("smaug-bpe", "Llama 3 without ignore_merges", (LLAMA3_PATTERN,), False),
    PreTokenizer("qwen2", "Qwen1.5 to Qwen3, DeepSeek-R1-Distill-Qwen", (QWEN2_PATTERN,), False),
    PreTokenizer("smollm", "SmolLM", (DIGIT_PATTERN, GPT2_PATTERN), ignore_merges=False),
    PreTokenizer("gpt-2", "GPT-2", (GPT2_PATTERN,), ignore_merges=False),
    PreTokenizer("tekken", "Mistral Nemo", (TEKKEN_PATTERN,), ignore_merges=True),
)


@dataclass(frozen=True)
class _Cutting:
    """What a tokenizer.json says about cutting text, in the terms llama.cpp's rules use."""

    splits: tuple[str, ...]
    ignore_merges: bool
    byte_level: bool
    unsupported: tuple[str, ...]
    """Parts no llama.cpp rule reproduces, described for the user."""


def _short(pattern: str, limit: int = 60) -> str:
    return pattern if len(pattern) <= limit else pattern[: limit - 3] + "..."


def _flatten(node: Any, key: str) -> list[dict[str, Any]]:
    """The steps of a normaliser or pre-tokenizer, Sequence nodes expanded (``key`` holds their
    children: "normalizers" or "pretokenizers")."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [step for child in node.get(key) or [] for step in _flatten(child, key)]
    return [node]


def _cutting(spec: Mapping[str, Any]) -> _Cutting:
    splits: list[str] = []
    unsupported: list[str] = []
    byte_level = False
    for step in _flatten(spec.get("normalizer"), "normalizers"):
        if step.get("type") != "NFC":
            unsupported.append(f"normaliser {step.get('type')}")
    for step in _flatten(spec.get("pre_tokenizer"), "pretokenizers"):
        kind = step.get("type")
        if kind == "ByteLevel":
            byte_level = True
            if step.get("add_prefix_space"):
                unsupported.append("ByteLevel with add_prefix_space")
            if step.get("use_regex", True):
                splits.append(GPT2_PATTERN)
        elif kind == "Digits" and step.get("individual_digits"):
            splits.append(DIGIT_PATTERN)
        elif (
            kind == "Split"
            and "Regex" in (step.get("pattern") or {})
            and step.get("behavior") == "Isolated"
            and not step.get("invert")
        ):
            splits.append(str(step["pattern"]["Regex"]))
        elif kind == "Split":
            shown = _short(str(step.get("pattern")))
            unsupported.append(f"Split({shown}, behavior {step.get('behavior')})")
        else:
            unsupported.append(f"pre-tokenizer {kind}")
    decoder_steps = _flatten(spec.get("decoder"), "decoders")
    byte_level = byte_level or any(step.get("type") == "ByteLevel" for step in decoder_steps)
    model = spec.get("model") or {}
    return _Cutting(
        tuple(splits), bool(model.get("ignore_merges", False)), byte_level, tuple(unsupported)
    )


def _describe(cutting: _Cutting) -> str:
    parts = [f"split '{_short(p)}'" for p in cutting.splits] + list(cutting.unsupported)
    return "; ".join(parts) or "no pre-tokenizer"


def _known() -> str:
    return "; ".join(f"{p.name} ({p.families})" for p in PRE_TOKENIZERS)


def pre_tokenizer_name(spec: Mapping[str, Any], tokenizer_name: str) -> str:
    """llama.cpp's pre-tokenizer name for a byte-level BPE tokenizer.

    Args:
        spec: the tokenizer's tokenizer.json, parsed (``backend_tokenizer.to_str()``).
        tokenizer_name: where the tokenizer came from, for messages.

    Raises:
        UserError: naming the tokenizer, when it is not byte-level BPE (SentencePiece-style
            tokenizers such as Llama 2's or Mistral 7B's) or when no llama.cpp pre-tokenizer in
            :data:`PRE_TOKENIZERS` reproduces how it cuts text.
    """
    convert = (
        "Export with --format hf and convert the directory with llama.cpp's "
        "convert_hf_to_gguf.py, which knows more tokenizers."
    )
    model_type = (spec.get("model") or {}).get("type")
    cutting = _cutting(spec)
    if model_type != "BPE" or not cutting.byte_level:
        kind = "SentencePiece-style " if model_type in ("BPE", "Unigram") else ""
        raise UserError(
            f"GGUF export: the tokenizer of {tokenizer_name} is a {kind}{model_type} tokenizer "
            "without byte-level pre-tokenization (as Llama 2, Mistral 7B, TinyLlama and Gemma "
            "have); grpokit's GGUF export writes byte-level BPE tokenizers, with llama.cpp's "
            f"pre-tokenizers {_known()}. {convert}"
        )
    if not cutting.unsupported:
        same_cut = [p for p in PRE_TOKENIZERS if p.splits == cutting.splits]
        for pre in same_cut:
            if pre.ignore_merges == cutting.ignore_merges:
                return pre.name
        if same_cut:
            raise UserError(
                f"GGUF export: the tokenizer of {tokenizer_name} cuts text as llama.cpp's "
                f"'{same_cut[0].name}' pre-tokenizer does, but with BPE ignore_merges "
                f"{cutting.ignore_merges}, which no llama.cpp pre-tokenizer known to grpokit "
                f"combines with it. {convert}"
            )
    raise UserError(
        f"GGUF export: no llama.cpp pre-tokenizer known to grpokit cuts text as the tokenizer of "
        f"{tokenizer_name} does ({_describe(cutting)}); writing one anyway would make llama.cpp "
        f"tokenize text differently from transformers. Known: {_known()}. {convert}"
    )
