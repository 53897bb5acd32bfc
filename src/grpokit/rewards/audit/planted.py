"""Planted bad answers: texts built from the user's own prompts that a sound reward scores at the
bottom of its scale (gibberish, an empty answer, the prompt copied back, a long repetition, the
rubric's keywords with no content). A reward that gives them more than real answers will be
gamed by the policy; both audits plant them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from grpokit.rewards.judge.rubric import Rubric

PLANTED_PROMPTS = 3
"""Prompts the planted answers are built for (each kind once per prompt)."""

_BULLET_RE = re.compile(r"^\s*(?:[-*•・]|\d+[.)])\s+(?P<text>.+?)\s*$")
_POINTS_RE = re.compile(
    r"(?:\+|プラス|加点|plus)\s*\d|\d+(?:\.\d+)?\s*(?:点|points?|pts?)\b", re.IGNORECASE
)
_KEYWORD_CUT_RE = re.compile(
    r"[(（:：,，、。]|について|であれば|が|を|\s(?:is|are|if|must|should|has|have|was)\s",
    re.IGNORECASE,
)


def rubric_keywords(rubric: Rubric) -> list[str]:
    """The criteria named in a rubric's bullet list ("- Revenue model (pricing) ... +0.2")."""
    bullets = [m.group("text") for m in map(_BULLET_RE.match, rubric.template.splitlines()) if m]
    scored = [b for b in bullets if _POINTS_RE.search(b)]
    keywords: list[str] = []
    for bullet in scored or bullets:
        head = _KEYWORD_CUT_RE.split(bullet, maxsplit=1)[0].strip(" *_`.")
        if head and len(head) <= 40 and "{" not in head and head not in keywords:
            keywords.append(head)
    return keywords


def _wrap(content: str, tags: Sequence[str] | None) -> str:
    if not tags:
        return content
    return "\n".join(f"<{tag}>\n{content}\n</{tag}>" for tag in tags)


def planted_answers(
    prompt: str, rubric: Rubric, tags: Sequence[str] | None, rng: random.Random
) -> dict[str, str]:
    """Bad answers to ``prompt`` that a sound judge scores at the bottom of its scale.

    Wrapped in the recipe's format tags when it has some, so that a format gate would pass them
    and only the judge stands between them and the reward.
    """
    chars = [c for c in (prompt + rubric.template) if not c.isspace() and c not in "{}"]
    rng.shuffle(chars)
    gibberish = " ".join("".join(chars[i : i + 7]) for i in range(0, min(len(chars), 280), 7))
    keywords = rubric_keywords(rubric) or ["revenue model", "customer", "product", "KPI"]
    sentence = (prompt.strip() or "This is a great idea.").splitlines()[0][:80]
    # Long enough to be obviously padded, short enough to fit a small judge's context.
    repeats = max(3, 600 // (len(sentence) + 1))
    return {
        "gibberish": _wrap(gibberish, tags),
        "empty": _wrap("", tags),
        "prompt_copy": _wrap(prompt.strip(), tags),
        "repetitive": _wrap("\n".join([sentence] * repeats), tags),
        "keyword_list": _wrap("\n".join(f"- {k}" for k in keywords), tags),
    }
