"""The ``expected`` scoring mode: a probability-weighted score from the judge's token logprobs.

G-Eval (Liu et al. 2023) replaces the sampled score by the mean over score values weighted by
the judge's probability of writing each one; the reward then varies smoothly between
completions instead of jumping between a few sampled values, and does not depend on one
sample. With a 1-5 scale the score is one token. A score such as "0.6" takes several tokens;
here the distribution is read at the token that writes the number's last digit (the finest step
of the scale: the tenths of a 0-1 score, the units of a 1-10 one), with the digits before it as
written: every alternative there (top logprobs) that spells an in-range number counts with its
probability, alternatives that spell no number are left out and the weights renormalised. On a
one-token integer scale this is exactly G-Eval's weighted mean.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from grpokit.rewards.judge.parse import ParsedScore, find_score, normalise

_LEADING_NUMBER_RE = re.compile(r"^-?(?:0|[1-9]\d*)(?:\.\d+)?")


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token of a judge reply, with the alternatives the backend reported."""

    offset: int
    """Index of the token's first character in the reply text."""
    token: str
    """The token's text (possibly empty for a token that only completes a multi-byte char)."""
    logprob: float
    """Log-probability of this token."""
    top: tuple[tuple[str, float], ...]
    """The most likely tokens at this position with their log-probabilities (may include this one)."""


def _candidate_number(text: str) -> float | None:
    """The number ``text`` spells if the judge stopped writing digits there, else None."""
    folded = unicodedata.normalize("NFKC", text)
    match = _LEADING_NUMBER_RE.match(folded)
    if match is None:
        return None
    rest = folded[match.end() :]
    # "00" or "0.6" followed by a digit is a different (longer) number, not this one.
    if rest[:1].isdigit() or (rest[:1] == "." and rest[1:2].isdigit()):
        return None
    return float(match.group(0))


def expected_score(
    reply: str, tokens: Sequence[TokenLogprob], low: float, high: float
) -> float | None:
    """The probability-weighted score of a judge reply, normalised to [0, 1].

    ``tokens`` must cover ``reply`` (offsets into it). Returns None when the reply has no
    score; falls back to the parsed score when no token overlaps the score's number.
    """
    parsed = find_score(reply, low, high)
    if parsed is None:
        return None
    return weighted_score(reply, parsed, tokens, low, high)


def weighted_score(
    reply: str, parsed: ParsedScore, tokens: Sequence[TokenLogprob], low: float, high: float
) -> float:
    """The probability-weighted value of the score ``parsed`` found in ``reply``, normalised to
    [0, 1] (the written score where no token covers it)."""
    span = [
        tok
        for tok in tokens
        if tok.offset < parsed.end and tok.offset + max(len(tok.token), 1) > parsed.start
    ]
    if not span:
        return normalise(parsed.value, low, high)
    tok = span[-1]
    # Digits before this token are kept; the distribution at the token that writes the last
    # digit is read off. A different leading digit would change how the number continues,
    # which the logprobs of the written path do not tell.
    prefix = reply[parsed.start : max(tok.offset, parsed.start)]
    lead = reply[tok.offset : parsed.start] if tok.offset < parsed.start else ""
    weight_sum = math.exp(tok.logprob)
    value_sum = weight_sum * normalise(parsed.value, low, high)
    for alt, alt_logprob in tok.top:
        if alt == tok.token:
            continue
        if lead.strip():
            if not alt.startswith(lead):
                continue
            core = alt[len(lead) :]
        else:
            core = alt.lstrip() if not prefix else alt
        if not core[:1].isdigit():
            # A token that writes no digit here ends the number early or starts other text:
            # not a score on the same footing.
            continue
        number = _candidate_number(prefix + core)
        if number is None:
            continue
        value = parsed.rescale(number, low, high)
        if not low - 1e-9 <= value <= high + 1e-9:
            continue
        weight = math.exp(alt_logprob)
        weight_sum += weight
        value_sum += weight * normalise(value, low, high)
    return value_sum / weight_sum
