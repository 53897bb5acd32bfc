"""Text metrics of a step's completions that reveal degenerate outputs.

Tokenisation: the metrics do not use the model's tokenizer (they must compare runs of different
models). A completion is split on whitespace, and every CJK character (kana, kanji/hanzi, hangul,
CJK and full-width punctuation) becomes a token of its own, because Japanese and Chinese put no
spaces between words. Other runs of non-space characters (English words, numbers, the box-drawing
branches of a logic tree such as ``├─``) stay one token each.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

# One CJK character, or a run of non-space characters that contains none.
_CJK = (
    "\u3000-\u303f"  # CJK symbols and punctuation
    "\u3040-\u30ff"  # hiragana, katakana
    "\u31f0-\u31ff"  # katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff00-\uffef"  # half-width and full-width forms
)
_TOKEN_RE = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")

REPEATED_NGRAM_FRAC = "completions/repeated_ngram_frac"
DISTINCT_2 = "completions/distinct_2"
MAX_GROUP_DUPLICATE_FRAC = "completions/max_group_duplicate_frac"


def tokenize(text: str) -> list[str]:
    """Split on whitespace, with each CJK character a token of its own.

    >>> tokenize("体重を減らす tips: eat less")
    ['体', '重', 'を', '減', 'ら', 'す', 'tips:', 'eat', 'less']
    """
    return _TOKEN_RE.findall(text)


def _ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def repeated_ngram_frac(tokens: Sequence[str], n: int = 3) -> float | None:
    """Share of a completion's n-grams that repeat an earlier n-gram of the same completion.

    None when the completion has fewer than n tokens (no n-gram to judge).
    """
    grams = _ngrams(tokens, n)
    if not grams:
        return None
    seen: set[tuple[str, ...]] = set()
    repeats = 0
    for g in grams:
        if g in seen:
            repeats += 1
        else:
            seen.add(g)
    return repeats / len(grams)


def text_stats(completions: list[str], group_size: int, *, n: int = 3) -> dict[str, float]:
    """Per-step text metrics over a batch of completions, grouped as the trainer samples them.

    Args:
        completions: B texts, the G = group_size completions of each prompt next to each other
            (B = number of prompts x G), as TRL orders them.
        group_size: G.
        n: n of the repeated n-gram share.

    Returns:
        ``completions/repeated_ngram_frac``: mean over completions with at least n tokens of the
        share of their n-grams that repeat an earlier n-gram of the same completion (0 when no
        completion is that long).
        ``completions/distinct_2``: distinct bigrams / all bigrams, pooled over the batch (1 when
        there is no bigram).
        ``completions/max_group_duplicate_frac``: over groups, the largest share of a group's
        completions equal to the group's most common text (after stripping surrounding
        whitespace); 1/G means all different, 1 means all the same.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if len(completions) % group_size:
        raise ValueError(f"{len(completions)} completions do not split into groups of {group_size}")
    token_lists = [tokenize(c) for c in completions]
    shares = [s for s in (repeated_ngram_frac(t, n) for t in token_lists) if s is not None]
    bigrams: Counter[tuple[str, ...]] = Counter()
    for tokens in token_lists:
        bigrams.update(_ngrams(tokens, 2))
    total_bigrams = sum(bigrams.values())
    dup = 0.0
    for start in range(0, len(completions), group_size):
        group = [c.strip() for c in completions[start : start + group_size]]
        dup = max(dup, Counter(group).most_common(1)[0][1] / group_size)
    return {
        REPEATED_NGRAM_FRAC: sum(shares) / len(shares) if shares else 0.0,
        DISTINCT_2: len(bigrams) / total_bigrams if total_bigrams else 1.0,
        MAX_GROUP_DUPLICATE_FRAC: dup,
    }
