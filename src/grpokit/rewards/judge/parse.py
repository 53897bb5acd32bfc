"""Reading a score out of a judge's free-text reply, and normalising it to [0, 1].

Judges rarely answer with the bare number the rubric asks for: they write "0.6点",
"**Score**: 3/5", "8 out of 10", full-width "０．６", or a sentence around the number. The parser
finds the number that is the score and says where it is in the reply (the logprob-weighted
``expected`` mode needs the position). A reply with no usable number gives None, never 0: a
parse failure is not a low score.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

ScoreKind = Literal["plain", "fraction", "percent"]

_NUM = r"-?\d+(?:\.\d+)?|-?\.\d+"
# Words after which the number is the score. Japanese forms are matched after NFKC folding.
_KEYWORDS = (
    r"score|rating|grade|total|final|result|points?|"
    r"スコア|点数|得点|評価|採点|合計|総合|結果"
)
_KEYWORD_RE = re.compile(
    rf"(?:{_KEYWORDS})\s*[*_`#]*\s*(?:\([^)]*\))?\s*(?:[:=は]|is|of|was|would be)?\s*[*_`]*\s*"
    rf"(?P<num>{_NUM})",
    re.IGNORECASE,
)
# ASCII-only lookbehind: "は0.6" must match, "v2" or "x3" must not.
_NUMBER_RE = re.compile(rf"(?<![0-9A-Za-z_.])(?P<num>{_NUM})")
_LIST_MARKER_AFTER_RE = re.compile(r"^[.)]\s+\D")
# A scale written out ("(1-5)", "0 to 10", "0.0から1.0") and a denominator ("/5", "out of 10")
# are not scores.
_RANGE_RE = re.compile(rf"(?<![0-9A-Za-z_.])(?:{_NUM})\s*(?:-|–|~|〜|to|から)\s*(?:{_NUM})")
_DENOMINATOR_BEFORE_RE = re.compile(r"(?:/|out\s+of|\bof)\s*$", re.IGNORECASE)
_FRACTION_RE = re.compile(
    rf"^\s*(?:/|out\s+of|of)\s*(?P<den>{_NUM})",
    re.IGNORECASE,
)
_PERCENT_RE = re.compile(r"^\s*(?:%|パーセント)")
_POINT_SUFFIX_RE = re.compile(r"^\s*(?:点|pts?\b|points?\b)", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedScore:
    """A score found in a judge reply.

    ``start``/``end`` index the score's number (the numerator of a fraction) in the reply as
    given, so that token positions can be mapped onto it.
    """

    value: float
    """The score on the rubric's scale (already converted from a fraction or percentage)."""
    number: float
    """The number as written at ``start:end``."""
    start: int
    end: int
    kind: ScoreKind
    denominator: float | None
    """The denominator of a fraction ("3/5" -> 5), else None."""

    def rescale(self, number: float, low: float, high: float) -> float:
        """The scale value another number written in the same place would mean.

        Used by the expected mode: if the judge had written ``number`` instead of
        ``self.number`` (same fraction or percent form), this is the score it would mean.
        """
        return _to_scale(number, self.kind, self.denominator, low, high)


def _to_scale(
    number: float, kind: ScoreKind, denominator: float | None, low: float, high: float
) -> float:
    if kind == "percent":
        return low + (high - low) * number / 100.0
    if kind == "fraction" and denominator is not None:
        # "8/10" on a 0-10 scale is 8; "3/5" on a 0-1 scale is the fraction 0.6.
        if abs(denominator - high) < 1e-9:
            return number
        return low + (high - low) * number / denominator
    return number


def _fold(text: str) -> tuple[str, list[int]]:
    """NFKC-fold ``text`` (full-width digits, "．", "：") keeping a map back to original offsets.

    Returns the folded text and, for each folded character, the index of the original character
    it came from (plus one sentinel for the end).
    """
    folded: list[str] = []
    origin: list[int] = []
    for i, ch in enumerate(text):
        norm = unicodedata.normalize("NFKC", ch)
        folded.append(norm)
        origin.extend([i] * len(norm))
    origin.append(len(text))
    return "".join(folded), origin


def _describe(folded: str, start: int, end: int, low: float, high: float) -> ParsedScore | None:
    number = float(folded[start:end])
    after = folded[end:]
    kind: ScoreKind = "plain"
    denominator: float | None = None
    frac = _FRACTION_RE.match(after)
    if frac is not None:
        den = float(frac.group("den"))
        if den > 0:
            kind, denominator = "fraction", den
    elif _PERCENT_RE.match(after):
        kind = "percent"
    value = _to_scale(number, kind, denominator, low, high)
    if not low - 1e-9 <= value <= high + 1e-9:
        return None
    return ParsedScore(
        value=min(max(value, low), high),
        number=number,
        start=start,
        end=end,
        kind=kind,
        denominator=denominator,
    )


def _is_list_marker(folded: str, start: int, end: int) -> bool:
    """True for "1. ..." / "2) ..." at the start of a line: an enumeration, not a score."""
    if "." in folded[start:end]:
        return False
    line_start = folded.rfind("\n", 0, start) + 1
    if folded[line_start:start].strip():
        return False
    return _LIST_MARKER_AFTER_RE.match(folded[end:]) is not None


def find_score(reply: str, low: float, high: float) -> ParsedScore | None:
    """Find the score in a judge reply on the scale ``[low, high]``; None if there is none.

    Order of preference, first match wins:

    1. a number after a score word ("Score: 3/5", "**評価**: 0.8", "合計 0.6"), the last one;
    2. a number with a points suffix ("0.6点", "7 points");
    3. a reply that starts with a number (the rubric's "only the number", then chatter);
    4. the last number in the reply.

    Enumeration markers ("1. ..."), written-out scales ("(1-5)", "0から1") and denominators are
    not taken for the score.

    Fractions ("3/5", "8 out of 10") and percentages ("60%") are converted to the scale. A
    number outside ``[low, high]`` is skipped: a judge that answers "7" on a 0-1 scale has not
    given a usable score, and guessing its scale would hide a broken rubric.
    """
    if low >= high:
        raise ValueError(f"score range must have low < high, got [{low}, {high}]")
    folded, origin = _fold(reply)

    def located(start: int, end: int) -> ParsedScore | None:
        parsed = _describe(folded, start, end, low, high)
        if parsed is None:
            return None
        # Map back to the caller's text (NFKC can change lengths, e.g. "½").
        return ParsedScore(
            parsed.value,
            parsed.number,
            origin[start],
            origin[end - 1] + 1,
            parsed.kind,
            parsed.denominator,
        )

    for match in reversed(list(_KEYWORD_RE.finditer(folded))):
        found = located(match.start("num"), match.end("num"))
        if found is not None:
            return found
    in_range_phrase = [m.span() for m in _RANGE_RE.finditer(folded)]
    numbers = [
        m
        for m in _NUMBER_RE.finditer(folded)
        if not _is_list_marker(folded, m.start("num"), m.end("num"))
        and not _DENOMINATOR_BEFORE_RE.search(folded[max(0, m.start("num") - 12) : m.start("num")])
        and not any(a <= m.start("num") < b for a, b in in_range_phrase)
    ]
    for match in numbers:
        if _POINT_SUFFIX_RE.match(folded[match.end("num") :]):
            found = located(match.start("num"), match.end("num"))
            if found is not None:
                return found
    stripped = folded.lstrip(" \t\r\n*_`#>\"'")
    offset = len(folded) - len(stripped)
    if numbers and numbers[0].start("num") == offset:
        found = located(numbers[0].start("num"), numbers[0].end("num"))
        if found is not None:
            return found
    for match in reversed(numbers):
        found = located(match.start("num"), match.end("num"))
        if found is not None:
            return found
    return None


def parse_score(reply: str, low: float, high: float) -> float | None:
    """The score in ``reply`` normalised to [0, 1], or None if no usable score is found."""
    found = find_score(reply, low, high)
    return None if found is None else normalise(found.value, low, high)


def normalise(value: float, low: float, high: float) -> float:
    """Map a score on ``[low, high]`` to [0, 1] (clipped)."""
    if low >= high:
        raise ValueError(f"score range must have low < high, got [{low}, {high}]")
    return min(1.0, max(0.0, (value - low) / (high - low)))
