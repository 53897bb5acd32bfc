"""``math_answer``: is the completion's final answer mathematically equal to the dataset's?

The answer is taken from the completion in a configurable order (by default: the last
``<answer>…</answer>``, else the last ``\\boxed{…}``, else the last number), then compared with the
answer column by math-verify, so "0.5" equals "1/2" and "\\frac{1}{2}", "1,000" equals "1000".

math-verify bounds its own run time with ``signal.alarm``, which only works in the main thread.
Called from another thread, this reward turns math-verify's timeouts off (it would raise
otherwise) and instead refuses candidate answers longer than ``max_answer_chars``, which keeps
sympy away from the inputs that make it slow.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grpokit.rewards._base import Reward
from grpokit.rewards.registry import BuildContext, register_reward
from grpokit.rewards.text import column_value, completion_text

logger = logging.getLogger(__name__)

Source = Literal["tag", "boxed", "last_number"]

_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


class MathAnswerParams(BaseModel):
    """Parameters of ``math_answer``."""

    model_config = ConfigDict(extra="forbid")

    answer_column: str = Field(
        default="answer", description="Dataset column holding the reference answer."
    )
    answer_tag: str = Field(
        default="answer",
        description="Tag whose content is the answer for the `tag` source (<answer>42</answer>).",
    )
    extract_from: list[Source] = Field(
        default=["tag", "boxed", "last_number"],
        min_length=1,
        description="Where to look for the completion's answer, in order; the first source that "
        "finds something is used: `tag` (last <answer_tag>), `boxed` (last \\boxed{}), "
        "`last_number` (last number in the text).",
    )
    gold_after: str | None = Field(
        default=None,
        description="If set, only the part of the reference answer after the last occurrence of "
        "this marker is used (GSM8K answers end with '#### 72': use '####').",
    )
    correct_score: float = Field(default=1.0, description="Reward for an equal answer.")
    wrong_score: float = Field(default=0.0, description="Reward for a different or missing answer.")
    timeout_s: int = Field(
        default=5, ge=1, description="Time limit for math-verify's parsing and comparison."
    )
    max_answer_chars: int = Field(
        default=500,
        ge=1,
        description="Longer extracted answers count as wrong without being parsed.",
    )


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced.

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}} and done")
    '\\\\frac{1}{2}'
    """
    last: str | None = None
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    last = text[start:i]
                    break
    return last


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last ``<tag>…</tag>``.

    >>> extract_tag("<answer>1</answer> <answer> 2 </answer>", "answer")
    '2'
    """
    found = re.findall(rf"<{re.escape(tag)}(?:\s[^<>]*)?>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
    return found[-1].strip() if found else None


def extract_last_number(text: str) -> str | None:
    """The last number in the text (thousands commas and simple fractions allowed).

    >>> extract_last_number("3 apples and 1,250.5 pears, i.e. 7/8")
    '7/8'
    """
    found = _NUMBER_RE.findall(text)
    return found[-1].replace(" ", "") if found else None


def extract_answer(text: str, sources: list[Source], tag: str = "answer") -> str | None:
    """The completion's answer from the first source in ``sources`` that finds one."""
    for source in sources:
        if source == "tag":
            found = extract_tag(text, tag)
        elif source == "boxed":
            found = extract_boxed(text)
        else:
            found = extract_last_number(text)
        if found:
            return found
    return None


def _parse(expression: str, timeout: int | None) -> list[Any]:
    from math_verify import parse

    stripped = expression.strip()
    if not stripped.startswith("$"):
        # Inside $...$ math-verify reads LaTeX (\frac12, 2^{1/2}) as well as plain numbers.
        parsed = parse(f"${stripped}$", parsing_timeout=timeout)
        if parsed:
            return list(parsed)
    return list(parse(stripped, parsing_timeout=timeout))


def answers_equal(gold: str, predicted: str, *, timeout_s: int | None = 5) -> bool | None:
    """True/False by math-verify; None when the reference answer itself cannot be parsed.

    Pass ``timeout_s=None`` outside the main thread (math-verify's timeout uses signals).

    >>> answers_equal("0.5", "\\\\frac{1}{2}")
    True
    >>> answers_equal("1/3", "0.33")
    False
    """
    from math_verify import verify

    if gold.strip() == predicted.strip():
        return True
    gold_parsed = _parse(gold, timeout_s)
    if not gold_parsed:
        return None
    predicted_parsed = _parse(predicted, timeout_s)
    if not predicted_parsed:
        return False
    return bool(verify(gold_parsed, predicted_parsed, timeout_seconds=timeout_s))


class MathAnswer(Reward):
    """The ``math_answer`` reward (see :func:`math_answer`)."""

    def __init__(self, params: MathAnswerParams, name: str = "math_answer") -> None:
        super().__init__(name)
        self.params = params
        self.required_columns = frozenset({params.answer_column})
        self._warned: set[str] = set()

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        p = self.params
        in_main = threading.current_thread() is threading.main_thread()
        timeout = p.timeout_s if in_main else None
        scores: list[float | None] = []
        for i, completion in enumerate(completions):
            raw_gold = column_value(columns, p.answer_column, i, self.__name__)
            if raw_gold is None or str(raw_gold).strip() == "":
                scores.append(None)
                continue
            gold = str(raw_gold)
            if p.gold_after is not None and p.gold_after in gold:
                gold = gold.rsplit(p.gold_after, 1)[1]
            predicted = extract_answer(completion_text(completion), p.extract_from, p.answer_tag)
            if predicted is None or len(predicted) > p.max_answer_chars:
                scores.append(p.wrong_score)
                continue
            equal = answers_equal(gold, predicted, timeout_s=timeout)
            if equal is None:
                if gold not in self._warned:
                    self._warned.add(gold)
                    logger.warning(
                        "math_answer: cannot parse the reference answer %r (column %r); "
                        "these rows get None (not applicable)",
                        gold,
                        p.answer_column,
                    )
                scores.append(None)
            else:
                scores.append(p.correct_score if equal else p.wrong_score)
        return scores


def math_answer(
    answer_column: str = "answer",
    *,
    answer_tag: str = "answer",
    extract_from: list[Source] | None = None,
    gold_after: str | None = None,
) -> MathAnswer:
    """1.0 where the completion's final answer equals the ``answer_column`` value, else 0.0;
    None where the reference answer is empty or unparseable.

    YAML: ``- {type: math_answer, answer_column: answer}``.

    >>> reward = math_answer()
    >>> reward(
    ...     prompts=["1/2 as a decimal?"] * 3,
    ...     completions=["<answer>0.5</answer>", r"It is \\boxed{\\frac{1}{2}}", "maybe 0.4"],
    ...     answer=["1/2", "1/2", "1/2"],
    ... )
    [1.0, 1.0, 0.0]
    """
    fields: dict[str, Any] = {
        "answer_column": answer_column,
        "answer_tag": answer_tag,
        "gold_after": gold_after,
    }
    if extract_from is not None:
        fields["extract_from"] = extract_from
    params = MathAnswerParams(**fields)
    return MathAnswer(params)


def _build(params: MathAnswerParams, ctx: BuildContext) -> MathAnswer:
    return MathAnswer(params)


register_reward("math_answer", MathAnswerParams, _build, max_value=1.0)
