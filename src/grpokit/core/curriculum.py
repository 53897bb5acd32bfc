"""A pass-rate curriculum: prompts whose last group was flat are drawn less often
(docs/math.md, "Groups that all score the same").

A group is flat when all its completions score the same (no learning signal: every advantage is
0). Each prompt keeps a small record of the groups drawn for it: how many, the last group's mean
total reward, and whether that group was flat. A prompt whose last group was flat is *easy* when
that mean is at least ``easy_threshold`` (every completion right) and *hard* otherwise (every
completion wrong); any other prompt, seen or not, is *normal*. When the prompt order reaches an
easy prompt it is kept with probability ``easy_keep_prob`` and passed over otherwise (hard:
``hard_keep_prob``; normal: always kept), so each step still gets its full number of prompts and
fewer of them are flat. A prompt passed over comes round again in the next epoch, and is judged
again each time it is drawn: one that has become learnable goes back to normal.

The pools follow prime-rl's difficulty pools (easy / normal / hard, from each problem's latest
group mean reward against easy_threshold and hard_threshold, sampled by pool share); here the
pool also needs the group to be flat, so it does not depend on the reward's scale (a format
reward plus a correctness reward is flat at 0.2 when every answer is wrong but well formatted).

The keep decision of the prompt at (epoch, position) is a uniform number that depends only on
(seed, epoch, position): every process draws the same, and a resumed run draws what the
uninterrupted one would, with no random state to save beyond the records.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "POOLS",
    "Curriculum",
    "Pool",
    "PromptRecord",
    "keep_draw",
    "pool_of",
    "pool_sizes",
    "record_group",
    "records_from_json",
    "records_to_json",
]

Pool = Literal["easy", "normal", "hard"]
POOLS: tuple[Pool, ...] = ("easy", "normal", "hard")


@dataclass(frozen=True)
class Curriculum:
    """The curriculum's settings (training.curriculum).

    easy_threshold: a flat group whose mean total reward is at least this makes its prompt easy;
        below it, hard.
    easy_keep_prob, hard_keep_prob: the probability in [0, 1] that the prompt order keeps an easy
        (hard) prompt when it reaches it; normal prompts are always kept.
    """

    easy_threshold: float = 0.5
    easy_keep_prob: float = 0.1
    hard_keep_prob: float = 0.1

    def __post_init__(self) -> None:
        for name in ("easy_keep_prob", "hard_keep_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")

    def keep_prob(self, pool: Pool) -> float:
        """The probability that the prompt order keeps a prompt of ``pool``."""
        if pool == "easy":
            return self.easy_keep_prob
        if pool == "hard":
            return self.hard_keep_prob
        return 1.0


@dataclass(frozen=True)
class PromptRecord:
    """What the curriculum knows of one prompt: ``groups`` drawn for it so far, and of the last
    one its mean total reward and whether it was flat (all completions scored the same)."""

    groups: int = 0
    mean: float = math.nan
    flat: bool = False


def record_group(record: PromptRecord | None, mean: float, flat: bool) -> PromptRecord:
    """``record`` after one more group with mean total reward ``mean``, ``flat`` or not.

    A group with no score at all (``mean`` NaN: every reward None) tells nothing: the record is
    unchanged (a new one for a prompt never seen).
    """
    record = record or PromptRecord()
    if math.isnan(mean):
        return record
    return PromptRecord(record.groups + 1, mean, flat)


def pool_of(record: PromptRecord | None, easy_threshold: float) -> Pool:
    """easy: the last group was flat at a mean of at least ``easy_threshold``; hard: flat below
    it; normal: the last group had a spread, or no group scored yet."""
    if record is None or not record.groups or not record.flat:
        return "normal"
    return "easy" if record.mean >= easy_threshold else "hard"


def pool_sizes(
    records: Mapping[int, PromptRecord], num_prompts: int, easy_threshold: float
) -> dict[Pool, int]:
    """How many of ``num_prompts`` prompts are in each pool (unseen ones are normal)."""
    sizes: dict[Pool, int] = dict.fromkeys(POOLS, 0)
    for record in records.values():
        sizes[pool_of(record, easy_threshold)] += 1
    sizes["normal"] += num_prompts - len(records)
    return sizes


def keep_draw(seed: int, epoch: int, position: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, epoch, position): the prompt order's
    keep decision for that slot is ``keep_draw(...) < keep_prob``."""
    return random.Random(f"curriculum:{seed}:{epoch}:{position}").random()


def records_from_json(data: object) -> dict[int, PromptRecord]:
    """The records as saved by :func:`records_to_json`.

    Raises:
        ValueError: naming what is malformed.
    """
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    out: dict[int, PromptRecord] = {}
    for key, value in data.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ValueError(f"key {key!r} is not a prompt index")
        if not (isinstance(value, list) and len(value) == 3):
            raise ValueError(f"prompt {key}: expected [groups, mean, flat], got {value!r}")
        groups, mean, flat = value
        valid = (
            isinstance(groups, int)
            and not isinstance(groups, bool)
            and groups >= 1
            and isinstance(mean, int | float)
            and not isinstance(mean, bool)
            and math.isfinite(mean)
            and isinstance(flat, bool)
        )
        if not valid:
            raise ValueError(f"prompt {key}: expected [groups, mean, flat], got {value!r}")
        out[int(key)] = PromptRecord(groups, float(mean), flat)
    return out


def records_to_json(records: Iterable[tuple[int, PromptRecord]]) -> dict[str, list[object]]:
    """The records as a JSON object: prompt index -> [groups, mean, flat]."""
    return {str(i): [r.groups, r.mean, r.flat] for i, r in records if r.groups}
