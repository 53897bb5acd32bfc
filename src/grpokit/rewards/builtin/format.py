"""``xml_format``: the seed article's three-level XML format reward, generalised to any tags.

The seed (article 000, section 4-2) asks for exactly ``<thinking>…</thinking><proposal>…</proposal>``
and scores 0.0 / 0.7 / 1.0. This module gives the same scores on every input, with one deliberate
difference: the seed hands the text to an XML parser, so a proposal that mentions "R&D" or
"cost < 5万円" scores 0.0 although its structure is perfect. Here, when the parser rejects the
text, stray ``&`` (not a valid entity reference) and ``<`` (not the start of a well-formed tag,
comment, CDATA section or processing instruction) are escaped and the text is parsed again; only
if it still fails is the score 0.0. A text the seed can parse is scored exactly as the seed does.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpokit.rewards._base import Reward
from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text

DEFAULT_TAGS: tuple[str, ...] = ("thinking", "proposal")

SCORE_INVALID = 0.0
SCORE_STRUCTURE_ONLY = 0.7
SCORE_COMPLIANT = 1.0

# The seed's tag-name scan (also sees tags the parser would not, e.g. inside comments): kept as is
# so that the 0.7 / 1.0 split matches the seed.
_SEED_TAG_RE = re.compile(r"</?\s*([A-Za-z0-9_:-]+)(?:\s[^>]*)?>")
_FENCE_OPEN_RE = re.compile(r"^```[a-zA-Z0-9_+-]*\n?")
_FENCE_CLOSE_RE = re.compile(r"\n?```$")

_NAME = r"(?:[^\W\d]|:)[\w.\-:]*"
_ATTRIBUTE = rf"\s+{_NAME}\s*=\s*(?:\"[^\"<]*\"|'[^'<]*')"
_STRAY_MARKUP_RE = re.compile(
    r"(?P<keep><!--.*?-->"
    r"|<!\[CDATA\[.*?\]\]>"
    r"|<\?.*?\?>"
    rf"|</{_NAME}\s*>"
    rf"|<{_NAME}(?:{_ATTRIBUTE})*\s*/?>"
    r"|&(?:amp|lt|gt|quot|apos);"
    r"|&#(?P<dec>[0-9]+);"
    r"|&#x(?P<hex>[0-9A-Fa-f]+);)"
    r"|(?P<lt><)"
    r"|(?P<amp>&)",
    re.DOTALL,
)
_TAG_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _validate_tags(tags: list[str]) -> list[str]:
    for tag in tags:
        if not _TAG_NAME_RE.match(tag):
            raise ValueError(
                f"tag {tag!r} is not a plain XML name (letters, digits, '_' or '-', "
                "not starting with a digit); write it without angle brackets"
            )
    if len(set(tags)) != len(tags):
        raise ValueError(f"tags must be distinct, got {tags}")
    return tags


class XmlFormatParams(BaseModel):
    """Parameters of ``xml_format``."""

    model_config = ConfigDict(extra="forbid")

    tags: list[str] = Field(
        default=list(DEFAULT_TAGS),
        min_length=1,
        description="The top-level tags the answer must consist of, in this order.",
    )

    @field_validator("tags")
    @classmethod
    def _valid_tags(cls, tags: list[str]) -> list[str]:
        return _validate_tags(tags)


def strip_code_fences(text: str) -> str:
    """Remove a code fence (```` ```xml ```` … ```` ``` ````) around the whole text, as the seed does.

    >>> strip_code_fences("```xml\\n<a>1</a>\\n```")
    '<a>1</a>'
    """
    stripped = (text or "").strip()
    if stripped.startswith("```"):
        stripped = _FENCE_OPEN_RE.sub("", stripped)
        stripped = _FENCE_CLOSE_RE.sub("", stripped)
    return stripped.strip()


def _is_xml_char(code_point: int) -> bool:
    return (
        code_point in (0x9, 0xA, 0xD)
        or 0x20 <= code_point <= 0xD7FF
        or 0xE000 <= code_point <= 0xFFFD
        or 0x10000 <= code_point <= 0x10FFFF
    )


def _escape_match(match: re.Match[str]) -> str:
    if match.group("lt") is not None:
        return "&lt;"
    if match.group("amp") is not None:
        return "&amp;"
    number = match.group("dec") or match.group("hex")
    if number is not None:
        code_point = int(number, 10 if match.group("dec") else 16)
        if not _is_xml_char(code_point):
            return "&amp;" + match.group(0)[1:]
    return match.group(0)


def escape_stray_markup(text: str) -> str:
    """Escape ``&`` and ``<`` that cannot start XML markup, leaving real markup untouched.

    >>> escape_stray_markup("<p>R&D: a < b &amp; c</p>")
    '<p>R&amp;D: a &lt; b &amp; c</p>'
    """
    return _STRAY_MARKUP_RE.sub(_escape_match, text)


def _parse(text: str) -> ET.Element | None:
    try:
        return ET.fromstring(f"<root>{text}</root>")
    except ET.ParseError:
        return None


def xml_format_score(text: str, tags: tuple[str, ...] | list[str] = DEFAULT_TAGS) -> float:
    """Score one text: 0.0 (broken), 0.7 (right structure, extras) or 1.0 (exactly the tags).

    - 0.0: a required tag is not opened and closed; the text is not XML even after escaping stray
      ``&`` / ``<``; or the top-level elements are not exactly ``tags`` in order.
    - 0.7: the top level is right, but there is another tag anywhere, a nested element, or
      non-whitespace text outside the tags.
    - 1.0: only the tags, in order, each holding plain text.

    >>> xml_format_score("<thinking>why</thinking>\\n<proposal>what</proposal>")
    1.0
    >>> xml_format_score("Sure!<thinking>why</thinking><proposal>what</proposal>")
    0.7
    >>> xml_format_score("<proposal>what</proposal><thinking>why</thinking>")
    0.0
    >>> xml_format_score("<thinking>R&D</thinking><proposal>a < b</proposal>")  # seed: 0.0
    1.0
    """
    tag_list = list(tags)
    text = strip_code_fences(text)
    if not all(f"<{tag}>" in text and f"</{tag}>" in text for tag in tag_list):
        return SCORE_INVALID
    root = _parse(text)
    if root is None:
        text = escape_stray_markup(text)
        root = _parse(text)
        if root is None:
            return SCORE_INVALID
    children = list(root)
    if [child.tag for child in children] != tag_list:
        return SCORE_INVALID
    outside_text = bool((root.text or "").strip()) or any(
        (child.tail or "").strip() for child in children
    )
    allowed = set(tag_list)
    extra_tags = any(m.group(1) not in allowed for m in _SEED_TAG_RE.finditer(text))
    nested = any(len(child) > 0 for child in children)
    if extra_tags or nested or outside_text:
        return SCORE_STRUCTURE_ONLY
    return SCORE_COMPLIANT


class XmlFormat(Reward):
    """The ``xml_format`` reward (see :func:`xml_format`)."""

    def __init__(self, params: XmlFormatParams, name: str = "xml_format") -> None:
        super().__init__(name)
        self.tags = tuple(params.tags)

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        return [xml_format_score(completion_text(c), self.tags) for c in completions]


def xml_format(tags: list[str] | tuple[str, ...] = DEFAULT_TAGS) -> XmlFormat:
    """The seed's format reward: 1.0 for exactly ``<tag1>…</tag1><tag2>…</tag2>…``, 0.7 for the
    right top level with extras, 0.0 otherwise (see :func:`xml_format_score`).

    YAML: ``- type: xml_format`` with optional ``tags: [thinking, answer]``.

    >>> reward = xml_format(tags=["thinking", "answer"])
    >>> reward(
    ...     prompts=["2+2?", "2+2?"],
    ...     completions=[
    ...         "<thinking>add</thinking><answer>4</answer>",
    ...         [{"role": "assistant", "content": "<answer>4</answer>"}],
    ...     ],
    ... )
    [1.0, 0.0]
    """
    return XmlFormat(XmlFormatParams(tags=list(tags)))


register_reward(
    "xml_format",
    XmlFormatParams,
    lambda params, ctx: XmlFormat(params),
    max_value=SCORE_COMPLIANT,
)


class TagsPresentParams(BaseModel):
    """Parameters of ``tags_present``."""

    model_config = ConfigDict(extra="forbid")

    tags: list[str] = Field(
        default=list(DEFAULT_TAGS),
        min_length=1,
        description="Tags that should each be opened and later closed somewhere in the completion.",
    )

    @field_validator("tags")
    @classmethod
    def _valid_tags(cls, tags: list[str]) -> list[str]:
        return _validate_tags(tags)


def tags_present_score(text: str, tags: tuple[str, ...] | list[str] = DEFAULT_TAGS) -> float:
    """Share of ``tags`` that are opened (``<tag>`` or ``<tag attr=…>``) and closed after that.

    Order between different tags, nesting and surrounding text do not matter: this is the soft
    signal for a cold start, where the strict :func:`xml_format_score` is 0 for every completion.

    >>> tags_present_score("<thinking>a</thinking> and <proposal>b", ["thinking", "proposal"])
    0.5
    """
    found = 0
    for tag in tags:
        opening = re.search(rf"<{re.escape(tag)}(?:\s[^<>]*)?>", text)
        if opening is None:
            continue
        if text.find(f"</{tag}>", opening.end()) >= 0:
            found += 1
    return found / len(tags)


class TagsPresent(Reward):
    """The ``tags_present`` reward (see :func:`tags_present`)."""

    def __init__(self, params: TagsPresentParams, name: str = "tags_present") -> None:
        super().__init__(name)
        self.tags = tuple(params.tags)

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        return [tags_present_score(completion_text(c), self.tags) for c in completions]


def tags_present(tags: list[str] | tuple[str, ...] = DEFAULT_TAGS) -> TagsPresent:
    """Partial credit, 1/len(tags) per required tag that is opened and closed.

    YAML: ``- type: tags_present`` with optional ``tags: [thinking, answer]``.

    >>> reward = tags_present(tags=["thinking", "answer"])
    >>> reward(prompts=None, completions=["<thinking>hm</thinking> 4", "<answer>4</answer>"])
    [0.5, 0.5]
    """
    return TagsPresent(TagsPresentParams(tags=list(tags)))


register_reward(
    "tags_present", TagsPresentParams, lambda params, ctx: TagsPresent(params), max_value=1.0
)
