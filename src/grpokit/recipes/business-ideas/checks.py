"""Program checks of the business-ideas checklist (config.checklist.program*.yaml).

``target_named``: does the proposal name the customer the prompt targets? The target is the text
after "Target:" (ターゲット：) up to the end of its sentence. In English, its content words (four
letters or more, matched on their first five letters so that "manufacturer" finds
"manufacturers"); in Japanese, which has no spaces, its character pairs within the runs between
particles and punctuation. The proposal passes when at least half of them appear in it. A prompt
without a target gives None (the item does not apply).
"""

from __future__ import annotations

import re
from typing import Any

from grpokit.rewards.text import completion_text, user_request

_TARGET_RE = re.compile(r"(?:Target|ターゲット)\s*[:：]\s*(?P<target>.+?)(?:[。]|\.\s|\.$|$)")
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z\-]{3,}")
_STOPWORDS = frozenset(
    {"with", "whose", "from", "that", "their", "they", "who", "mostly", "living"}
)
# Runs of Japanese text between particles and punctuation ("中小製造業の保全担当" -> two runs).
_JA_SPLIT_RE = re.compile(r"[のがをにへとでや、。・\s：:（）()]+")
SHARE = 0.5
"""The share of the target's words (pairs) the proposal must contain."""


def target_terms(target: str) -> list[str]:
    """The words (English) or character pairs (Japanese) that name a target."""
    words = [w.lower()[:5] for w in _WORD_RE.findall(target) if w.lower() not in _STOPWORDS]
    if words:
        return list(dict.fromkeys(words))
    pairs = [run[i : i + 2] for run in _JA_SPLIT_RE.split(target) for i in range(len(run) - 1)]
    return list(dict.fromkeys(pairs))


def names_target(prompt: str, completion: str) -> float | None:
    """1.0 when ``completion`` names the target of ``prompt``, 0.0 when not, None without one."""
    match = _TARGET_RE.search(prompt)
    if match is None:
        return None
    terms = target_terms(match.group("target"))
    if not terms:
        return None
    text = completion.lower()
    found = sum(term in text for term in terms)
    return 1.0 if found >= SHARE * len(terms) else 0.0


def target_named(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """The checklist item: :func:`names_target` for each (prompt, completion)."""
    return [
        names_target(user_request(p), completion_text(c))
        for p, c in zip(prompts, completions, strict=True)
    ]
