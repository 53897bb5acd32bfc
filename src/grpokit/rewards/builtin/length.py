"""Length and repetition shaping: ``length_penalty``, ``soft_overlong_punishment`` (DAPO) and
``repetition_penalty``. All three are <= 0, meant to be added to a main reward.

Lengths are counted in ``tokens`` by default, read from the ``completion_ids`` keyword argument
that TRL's GRPOTrainer and grpokit's trainer pass to every reward; ``chars`` and ``words`` need
nothing but the text (``grpokit rewards check`` has no token ids unless the JSONL gives them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpokit.errors import UserError
from grpokit.rewards._base import Reward
from grpokit.rewards.registry import register_reward
from grpokit.rewards.text import completion_text

Unit = Literal["tokens", "chars", "words"]

_UNIT_DESCRIPTION = (
    "What a length counts: `tokens` (from the completion_ids the trainer passes), `chars` or "
    "`words` (whitespace-separated; use chars for Japanese or Chinese)."
)


def completion_lengths(
    completions: Sequence[Any], columns: dict[str, Any], unit: Unit, reward: str
) -> list[int]:
    """Length of each completion in ``unit``."""
    if unit == "tokens":
        ids = columns.get("completion_ids")
        if ids is None:
            raise UserError(
                f"reward {reward!r} counts tokens but was called without `completion_ids`; "
                "set `unit: chars` or `unit: words`, or give completion_ids (e.g. in the JSONL "
                "for `rewards check`)"
            )
        if len(ids) != len(completions):
            raise UserError(
                f"reward {reward!r}: {len(ids)} completion_ids for {len(completions)} completions"
            )
        return [len(row) for row in ids]
    texts = [completion_text(c) for c in completions]
    if unit == "chars":
        return [len(t) for t in texts]
    return [len(t.split()) for t in texts]


class SoftOverlongParams(BaseModel):
    """Parameters of ``soft_overlong_punishment``."""

    model_config = ConfigDict(extra="forbid")

    max_completion_len: int = Field(
        ge=1,
        description="L_max: at or beyond this length the reward is -1 (usually the "
        "trainer's max_completion_length).",
    )
    soft_punish_cache: int = Field(
        ge=0,
        description="L_cache: the penalty ramps linearly from 0 to -1 over the last "
        "L_cache units before L_max.",
    )
    unit: Unit = Field(default="tokens", description=_UNIT_DESCRIPTION)

    @model_validator(mode="after")
    def _cache_fits(self) -> SoftOverlongParams:
        if self.soft_punish_cache > self.max_completion_len:
            raise ValueError(
                f"soft_punish_cache ({self.soft_punish_cache}) must not exceed "
                f"max_completion_len ({self.max_completion_len})"
            )
        return self


def soft_overlong_value(length: int, max_completion_len: int, soft_punish_cache: int) -> float:
    """DAPO's soft overlong punishment for one length (docs/math.md section 4).

    0 up to ``L_max - L_cache``; ``((L_max - L_cache) - length) / L_cache`` in the buffer; -1 from
    ``L_max`` on.

    >>> [soft_overlong_value(n, 10, 4) for n in (6, 8, 10, 12)]
    [0.0, -0.5, -1.0, -1.0]
    """
    start = max_completion_len - soft_punish_cache
    if length <= start:
        return 0.0
    if length >= max_completion_len:
        return -1.0
    return (start - length) / soft_punish_cache


class SoftOverlongPunishment(Reward):
    """The ``soft_overlong_punishment`` reward (see :func:`soft_overlong_punishment`)."""

    def __init__(self, params: SoftOverlongParams, name: str = "soft_overlong_punishment") -> None:
        super().__init__(name)
        self.params = params

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        p = self.params
        lengths = completion_lengths(completions, columns, p.unit, self.__name__)
        return [soft_overlong_value(n, p.max_completion_len, p.soft_punish_cache) for n in lengths]


def soft_overlong_punishment(
    max_completion_len: int, soft_punish_cache: int, *, unit: Unit = "tokens"
) -> SoftOverlongPunishment:
    """DAPO's length penalty: 0, then a linear ramp to -1 over the last ``soft_punish_cache``
    units before ``max_completion_len``, -1 beyond.

    YAML: ``- {type: soft_overlong_punishment, max_completion_len: 512, soft_punish_cache: 128}``.

    >>> reward = soft_overlong_punishment(10, 4)
    >>> reward(prompts=None, completions=["a", "b", "c"], completion_ids=[[1] * 5, [1] * 8, [1] * 11])
    [0.0, -0.5, -1.0]
    """
    return SoftOverlongPunishment(
        SoftOverlongParams(
            max_completion_len=max_completion_len, soft_punish_cache=soft_punish_cache, unit=unit
        )
    )


register_reward(
    "soft_overlong_punishment",
    SoftOverlongParams,
    lambda params, ctx: SoftOverlongPunishment(params),
    max_value=0.0,
)


class LengthPenaltyParams(BaseModel):
    """Parameters of ``length_penalty``."""

    model_config = ConfigDict(extra="forbid")

    free_length: int = Field(ge=0, description="Lengths up to this are not penalised.")
    per_unit: float = Field(
        default=0.01, gt=0, description="Penalty per unit of length beyond free_length."
    )
    max_penalty: float = Field(
        default=1.0, gt=0, description="The penalty never goes below -max_penalty."
    )
    unit: Unit = Field(default="tokens", description=_UNIT_DESCRIPTION)


def length_penalty_value(
    length: int, free_length: int, per_unit: float, max_penalty: float
) -> float:
    """``-min(max_penalty, per_unit * max(0, length - free_length))``.

    >>> [length_penalty_value(n, 10, 0.25, 1.0) for n in (5, 10, 12, 100)]
    [0.0, 0.0, -0.5, -1.0]
    """
    return -min(max_penalty, per_unit * max(0, length - free_length)) + 0.0


class LengthPenalty(Reward):
    """The ``length_penalty`` reward (see :func:`length_penalty`)."""

    def __init__(self, params: LengthPenaltyParams, name: str = "length_penalty") -> None:
        super().__init__(name)
        self.params = params

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        p = self.params
        lengths = completion_lengths(completions, columns, p.unit, self.__name__)
        return [length_penalty_value(n, p.free_length, p.per_unit, p.max_penalty) for n in lengths]


def length_penalty(
    free_length: int, *, per_unit: float = 0.01, max_penalty: float = 1.0, unit: Unit = "tokens"
) -> LengthPenalty:
    """A linear penalty for length beyond ``free_length``, capped at ``-max_penalty``.

    YAML: ``- {type: length_penalty, free_length: 200, per_unit: 0.005, unit: chars}``.

    >>> reward = length_penalty(3, per_unit=0.5, unit="words")
    >>> reward(prompts=None, completions=["one two", "one two three four", "a b c d e f g"])
    [0.0, -0.5, -1.0]
    """
    return LengthPenalty(
        LengthPenaltyParams(
            free_length=free_length, per_unit=per_unit, max_penalty=max_penalty, unit=unit
        )
    )


register_reward(
    "length_penalty", LengthPenaltyParams, lambda params, ctx: LengthPenalty(params), max_value=0.0
)


class RepetitionPenaltyParams(BaseModel):
    """Parameters of ``repetition_penalty``."""

    model_config = ConfigDict(extra="forbid")

    ngram_size: int = Field(default=3, ge=1, description="Length n of the n-grams compared.")
    max_penalty: float = Field(
        default=1.0, gt=0, description="Penalty of a completion made of one n-gram repeated."
    )
    unit: Unit = Field(
        default="words",
        description="What an n-gram is made of: `words` (whitespace-separated), `chars` (for "
        "Japanese or Chinese) or `tokens` (completion_ids).",
    )


def repeated_ngram_share(items: Sequence[Any], n: int) -> float:
    """``1 - distinct n-grams / n-grams``: 0 for no repetition, towards 1 for a loop.

    >>> repeated_ngram_share("a b c a b c a b c".split(), 3)
    0.5714285714285714
    >>> repeated_ngram_share(["x", "y"], 3)
    0.0
    """
    total = len(items) - n + 1
    if total <= 0:
        return 0.0
    distinct = {tuple(items[i : i + n]) for i in range(total)}
    return 1.0 - len(distinct) / total


class RepetitionPenalty(Reward):
    """The ``repetition_penalty`` reward (see :func:`repetition_penalty`)."""

    def __init__(self, params: RepetitionPenaltyParams, name: str = "repetition_penalty") -> None:
        super().__init__(name)
        self.params = params

    def score(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, Any]
    ) -> list[float | None]:
        p = self.params
        sequences: list[Sequence[Any]]
        if p.unit == "tokens":
            completion_lengths(completions, columns, "tokens", self.__name__)  # presence check
            sequences = [list(ids) for ids in columns["completion_ids"]]
        elif p.unit == "chars":
            sequences = [completion_text(c) for c in completions]
        else:
            sequences = [completion_text(c).split() for c in completions]
        return [-p.max_penalty * repeated_ngram_share(s, p.ngram_size) + 0.0 for s in sequences]


def repetition_penalty(
    ngram_size: int = 3, *, max_penalty: float = 1.0, unit: Unit = "words"
) -> RepetitionPenalty:
    """``-max_penalty x`` the share of repeated n-grams: 0 for varied text, near
    ``-max_penalty`` for a completion that loops.

    YAML: ``- {type: repetition_penalty, ngram_size: 4, unit: chars, weight: 0.5}``.

    >>> reward = repetition_penalty(2)
    >>> reward(prompts=None, completions=["the cat sat on the mat", "go go go go go"])
    [0.0, -0.75]
    """
    return RepetitionPenalty(
        RepetitionPenaltyParams(ngram_size=ngram_size, max_penalty=max_penalty, unit=unit)
    )


register_reward(
    "repetition_penalty",
    RepetitionPenaltyParams,
    lambda params, ctx: RepetitionPenalty(params),
    max_value=0.0,
)
