"""The seed article's format reward (seed 000, section 4-2), kept verbatim as the test oracle.

grpokit's ``xml_format`` must give the same score as this function on every input except those
with a stray ``&`` or ``<`` (where this one scores 0.0 for failing the XML parser). Only the
``debug`` printing is left out.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any

ALLOWED_TOP_TAGS = ("thinking", "proposal")

_TAG_RE = re.compile(r"</?\s*([A-Za-z0-9_:-]+)(?:\s[^>]*)?>")


def _as_text(completion: Any) -> str:
    if isinstance(completion, dict):
        return completion.get("content") or completion.get("text") or ""
    return str(completion)


def _strip_code_fences(text: str) -> str:
    t = (text or "").strip()
    if t.startswith("```"):
        t = re.sub(r"^```[a-zA-Z0-9_+-]*\n?", "", t)
        t = re.sub(r"\n?```$", "", t)
    return t.strip()


def seed_xml_format_reward(completions: Iterable[Any], **kwargs: Any) -> list[float]:
    rewards: list[float] = []
    for completion in completions:
        raw = _as_text(completion)
        text = _strip_code_fences(raw)
        has_thinking = "<thinking>" in text and "</thinking>" in text
        has_proposal = "<proposal>" in text and "</proposal>" in text
        if not (has_thinking and has_proposal):
            rewards.append(0.0)
            continue
        try:
            root = ET.fromstring(f"<root>{text}</root>")
        except ET.ParseError:
            rewards.append(0.0)
            continue
        children = list(root)
        child_tags = [c.tag for c in children]
        if child_tags != list(ALLOWED_TOP_TAGS):
            rewards.append(0.0)
            continue
        outside_text_ok = True
        if (root.text or "").strip():
            outside_text_ok = False
        for c in children:
            if (c.tail or "").strip():
                outside_text_ok = False
                break
        tag_names = {m.group(1) for m in _TAG_RE.finditer(text)}
        extra_tags = any(t not in ALLOWED_TOP_TAGS for t in tag_names)
        nested = any(len(list(c)) > 0 for c in children)
        if (not extra_tags) and (not nested) and outside_text_ok:  # noqa: SIM108
            score = 1.0
        else:
            score = 0.7
        rewards.append(score)
    return rewards
