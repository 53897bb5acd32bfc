"""Group-relative judging (``scoring: group``): the completions of one prompt in one judge call.

GRPO only uses how the completions of a prompt compare with each other, and a judge finds a
comparison easier than an absolute grade (OpenPipe's RULER builds on the same observation). The
group's distinct answers are shown together, numbered in a shuffled order, and the judge writes
one ``N: score`` line per answer; the scores are mapped back to the completions by number.

Judges favour some positions (often the first or the last answer shown). The order is drawn
from a seed and the answers' texts: over many groups each answer quality lands in every position
alike, so the bias averages out, and the same group is shown the same way again (the cache
answers it, a run is repeatable). The order is recorded with each score.

The reply parser is lenient about the form ("2: 0.6", "Answer 2 - 3/5", "**2**: 4",
``{"2": 0.6}``, ``{"id": 2, "score": 0.6}``) and strict about the number: an answer whose
number the reply does not give, or gives without a usable score, has no score (None) and counts
as a parse failure, never as a low score.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
from collections.abc import Sequence

from grpokit.rewards.judge.parse import ParsedScore, find_score

ANSWER_TEMPLATE = '<answer id="{number}">\n{text}\n</answer>'
"""How each answer of a group appears in the judge prompt ({completions})."""

# Where an answer's number is named in a reply: after a word ("Answer 2", "answer #2",
# '"id": 2', 'id="2"'), at the start of a line before a separator ("2: 0.6", "**2**: 4",
# "[2] - 3") or as a JSON key ('"2": 0.6'). A list marker ("2. The second ...") is not one.
_LABEL_RE = re.compile(
    r"(?:(?<![A-Za-z])(?:answer|id)|回答)\s*[#\"'=:：]*\s*(?P<word>\d+)"
    r"|^[ \t>*_\-•]*[#\[(]?\s*(?P<bare>\d+)\s*[\])]?\s*\**\s*(?=[:：=\-–])"
    r"|\"(?P<key>\d+)\"\s*:",
    re.IGNORECASE | re.MULTILINE,
)
# Separators between an answer's number and its score, skipped so the score leads the segment.
_SEPARATORS = " \t*_`\"'#:：=-–]>)"
_LONE_NUMBER_RE = re.compile(r"^[\s*_`>\-•]*(?P<num>-?\d+(?:\.\d+)?)[\s*_`.]*$")


def group_order(texts: Sequence[str], seed: int, salt: int = 0) -> list[int]:
    """The order a group's answers are shown in: ``order[k]`` is the index into ``texts`` of
    the answer shown as number k + 1.

    Drawn from ``seed``, ``salt`` (another draw for the same group, e.g. an audit's repeat) and
    the texts themselves, so the same group gets the same order again.
    """
    payload = json.dumps([seed, salt, list(texts)], ensure_ascii=False).encode("utf-8")
    rng = random.Random(int.from_bytes(hashlib.sha256(payload).digest()[:8], "big"))
    order = list(range(len(texts)))
    rng.shuffle(order)
    return order


def answers_block(shown: Sequence[str]) -> str:
    """The {completions} text: the answers in the order shown, numbered from 1."""
    return "\n\n".join(
        ANSWER_TEMPLATE.format(number=k, text=text) for k, text in enumerate(shown, start=1)
    )


def parse_group_reply(reply: str, count: int, low: float, high: float) -> dict[int, ParsedScore]:
    """The score the reply gives each answer number 1..count (offsets into ``reply``).

    Each mention of an answer's number starts a segment that runs to the next mention; the
    score is read from the segment as :func:`~grpokit.rewards.judge.parse.find_score` reads a
    whole reply. When a number is mentioned several times, the last mention that holds a score
    wins (a judge that reasons first gives its verdict last). A reply without any number label
    but with exactly ``count`` lines that each hold one number is read in order. Numbers
    missing from the result had no usable score.
    """
    labels = [
        (m, int(next(g for g in (m.group("word"), m.group("bare"), m.group("key")) if g)))
        for m in _LABEL_RE.finditer(reply)
    ]
    found: dict[int, ParsedScore] = {}
    for i, (match, number) in enumerate(labels):
        if not 1 <= number <= count:
            continue
        end = labels[i + 1][0].start() if i + 1 < len(labels) else len(reply)
        start = match.end()
        while start < end and reply[start] in _SEPARATORS:
            start += 1
        parsed = find_score(reply[start:end], low, high)
        if parsed is not None:
            found[number] = dataclasses.replace(
                parsed, start=parsed.start + start, end=parsed.end + start
            )
    if labels:
        return found
    lone: list[ParsedScore] = []
    offset = 0
    for line in reply.splitlines(keepends=True):
        lone_match = _LONE_NUMBER_RE.match(line)
        if lone_match is not None:
            parsed = find_score(lone_match.group("num"), low, high)
            if parsed is not None:
                shift = offset + lone_match.start("num")
                lone.append(
                    dataclasses.replace(parsed, start=parsed.start + shift, end=parsed.end + shift)
                )
        offset += len(line)
    if len(lone) == count:
        return {k: parsed for k, parsed in enumerate(lone, start=1)}
    return {}
