"""The ``yes_no`` scoring mode: a judge's answer to a yes/no question, as the probability of yes.

A checklist item asks the judge one question ("Does the proposal state a price?"). A written
"Yes" is a 0/1 success; the token log-probabilities say more: at the token where the judge wrote
its yes or no, the probabilities of every alternative that starts a yes word and every one that
starts a no word give P(yes) / (P(yes) + P(no)), the expected mode's idea (a probability-weighted
answer, read at the position of the written one) on a two-value scale. Without log-probs the
written word is the score (1.0 or 0.0); a reply with neither word holds no answer (None).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Sequence

from grpokit.rewards.judge.expected import TokenLogprob

YES_WORDS = ("yes", "はい")
NO_WORDS = ("no", "いいえ")
# A whole word: "no" in "not" or "know" is not an answer. Japanese has no spaces between words,
# so はい / いいえ match anywhere.
_ANSWER_RE = re.compile(r"(?<![A-Za-z])(yes|no)(?![A-Za-z])|(はい|いいえ)", re.IGNORECASE)
_TRAILING_RE = re.compile(r"[\s.,!?:;。、！？」』\"'*_`]+$")


def _fold(token: str) -> str:
    folded = unicodedata.normalize("NFKC", token).strip().lower()
    return _TRAILING_RE.sub("", folded.lstrip("*_`\"'「『"))


def token_answer(token: str) -> bool | None:
    """True for a token that writes (the start of) a yes word, False for a no word, else None.

    >>> token_answer(" Yes"), token_answer("NO."), token_answer("い"), token_answer("Not")
    (True, False, False, None)
    """
    folded = _fold(token)
    if not folded:
        return None
    yes = any(word.startswith(folded) for word in YES_WORDS)
    no = any(word.startswith(folded) for word in NO_WORDS)
    if yes == no:  # neither, or a prefix of both
        return None
    return yes


def find_answer(reply: str) -> tuple[bool, int] | None:
    """The first yes/no word of a reply and its offset; None when there is none.

    >>> find_answer("Answer: No, there is no price."), find_answer("I cannot tell.")
    ((False, 8), None)
    """
    # Searched in the reply as written (no folding), so the offset matches the tokens'.
    match = _ANSWER_RE.search(reply)
    if match is None:
        return None
    return match.group(0).lower() in YES_WORDS, match.start()


def parse_yes_no(reply: str) -> float | None:
    """1.0 for a reply that answers yes, 0.0 for no, None for neither."""
    found = find_answer(reply)
    return None if found is None else float(found[0])


def yes_probability(reply: str, tokens: Sequence[TokenLogprob]) -> float | None:
    """P(yes) / (P(yes) + P(no)) at the token that wrote the reply's first yes/no word.

    ``tokens`` cover ``reply`` (offsets into it); every alternative in a token's ``top`` that
    starts a yes (no) word adds its probability to yes (no). Falls back to the written answer
    when no token covers it. None when the reply holds no yes/no word.
    """
    found = find_answer(reply)
    if found is None:
        return None
    return probability_at(tokens, *found, classify=token_answer)


def probability_at(
    tokens: Sequence[TokenLogprob],
    written: bool,
    start: int,
    *,
    classify: Callable[[str], bool | None],
) -> float:
    """P(True) / (P(True) + P(False)) of a two-way answer written at offset ``start`` (as
    ``written``): the token covering ``start`` and its alternatives, each classified by
    ``classify`` (True, False, or None for neither); the written answer where no token covers
    it."""
    covering = [t for t in tokens if t.offset <= start < t.offset + max(len(t.token), 1)]
    if not covering:
        return float(written)
    tok = covering[0]
    mass = {True: 0.0, False: 0.0}
    mass[written] += math.exp(tok.logprob)
    for alt, logprob in tok.top:
        if alt == tok.token:
            continue
        answer = classify(alt)
        if answer is not None:
            mass[answer] += math.exp(logprob)
    return mass[True] / (mass[True] + mass[False])
