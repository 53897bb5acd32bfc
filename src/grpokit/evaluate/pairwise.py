"""Pairwise judging of two models' held-out answers: which is better, trained or base?

``grpokit eval`` scores each answer alone. A judge that grades one answer on an absolute scale is
noisy and drifts with the answer's length; asked which of two answers to the same prompt is
better, the same judge is steadier (the seed's plateau; AlpacaEval and Chatbot Arena measure
models this way). Here every sample k of model X on a prompt is paired with sample k of model Y
on the same prompt, and the judge is asked twice, X shown first and then Y shown first, because
judges favour a position. Each ask is read as P(first) / (P(first) + P(second)) from the token
log-probabilities at the written "A" or "B" (the written letter where the judge gives none), so
a pair's win probability for X is the mean of P(X | X first) and 1 - P(Y | Y first).

Reported, with the prompts as the independent units (the samples of one prompt are correlated):

- the win rate of X over Y, with a 95% t interval over per-prompt means;
- the position bias: the mean probability that the answer shown first wins (0.5 = none);
- the length-controlled win rate: a least-squares fit of each pair's win probability on the
  pair's length difference (X's tokens minus Y's), read at equal length, with a percentile
  interval from resampling prompts. A model that wins only by writing more wins the raw rate and
  not this one (the idea of AlpacaEval's length-controlled win rate, in its simplest form).
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from grpokit.core.stats import cluster_mean_stderr, t_quantile_975
from grpokit.errors import UserError
from grpokit.rewards.judge.backends.base import JudgeBackend, JudgeReply
from grpokit.rewards.judge.rubric import Rubric
from grpokit.rewards.judge.yes_no import probability_at

_CHOICE_RE = re.compile(r"(?<![A-Za-z])([AB])(?![A-Za-z])")


def choice_token(token: str) -> bool | None:
    """True for a token that writes the answer "A", False for "B", None otherwise.

    >>> choice_token(" A"), choice_token("B."), choice_token("**A**"), choice_token("An")
    (True, False, True, None)
    """
    folded = token.strip().strip("*_`\"'.,:;()[]")
    if folded == "A":
        return True
    if folded == "B":
        return False
    return None


def first_probability(reply: str, tokens: Sequence[Any]) -> float | None:
    """P(A) / (P(A) + P(B)) at the reply's first standalone "A" or "B"; None without one.

    >>> first_probability("B", []), first_probability("Neither.", [])
    (0.0, None)
    """
    match = _CHOICE_RE.search(reply)
    if match is None:
        return None
    return probability_at(tokens, match.group(1) == "A", match.start(), classify=choice_token)


@dataclass(frozen=True)
class PairVerdict:
    """One pair: sample ``sample`` of X and of Y on prompt ``prompt_index``."""

    prompt_index: int
    sample: int
    x_first: float | None
    """P(X better) asked with X shown as A; None when the reply named neither."""
    y_first: float | None
    """P(X better) asked with Y shown as A (1 - P(A))."""
    length_x: int
    length_y: int

    @property
    def win(self) -> float | None:
        """X's win probability: the mean of the two orders that gave an answer."""
        present = [p for p in (self.x_first, self.y_first) if p is not None]
        return statistics.fmean(present) if present else None


def _per_prompt(verdicts: Sequence[PairVerdict]) -> dict[int, list[PairVerdict]]:
    out: dict[int, list[PairVerdict]] = {}
    for v in verdicts:
        if v.win is not None:
            out.setdefault(v.prompt_index, []).append(v)
    return out


def win_rate(verdicts: Sequence[PairVerdict]) -> tuple[float, float, float]:
    """(mean win probability of X, low, high): the 95% t interval with prompts as units
    (:func:`cluster_mean_stderr`); (nan, nan, nan) without answered pairs, the mean alone
    (low = high = mean) with one prompt."""
    groups = _per_prompt(verdicts)
    wins = [v.win for g in groups.values() for v in g if v.win is not None]
    if not wins:
        return (math.nan, math.nan, math.nan)
    mean = statistics.fmean(wins)
    se = cluster_mean_stderr([[v.win for v in g if v.win is not None] for g in groups.values()])
    if se is None:
        return (mean, mean, mean)
    half = t_quantile_975(len(groups) - 1) * se
    return (mean, mean - half, mean + half)


def position_bias(verdicts: Sequence[PairVerdict]) -> float:
    """The mean probability that the answer shown first won, over every answered ask."""
    shown_first = [v.x_first for v in verdicts if v.x_first is not None]
    shown_first += [1.0 - v.y_first for v in verdicts if v.y_first is not None]
    return statistics.fmean(shown_first) if shown_first else math.nan


def _fit_at_zero(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares line through (length difference, win) read at difference 0; the plain
    mean when every difference is equal (no slope to fit)."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx == 0.0:
        return my
    slope = math.fsum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx


def length_controlled_win_rate(
    verdicts: Sequence[PairVerdict], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(win probability at equal length, low, high): :func:`_fit_at_zero` over the answered
    pairs, the interval the 2.5% and 97.5% points of the fit over ``resamples`` resamplings of
    the prompts (with replacement, each with all its pairs)."""
    groups = _per_prompt(verdicts)
    if not groups:
        return (math.nan, math.nan, math.nan)

    def points(keys: Sequence[int]) -> list[tuple[float, float]]:
        return [
            (float(v.length_x - v.length_y), v.win)
            for k in keys
            for v in groups[k]
            if v.win is not None
        ]

    keys = sorted(groups)
    estimate = _fit_at_zero(points(keys))
    if len(keys) < 2:
        return (estimate, estimate, estimate)
    rng = random.Random(seed)
    fits = sorted(_fit_at_zero(points(rng.choices(keys, k=len(keys)))) for _ in range(resamples))
    return (estimate, fits[int(0.025 * (resamples - 1))], fits[int(0.975 * (resamples - 1))])


@dataclass(frozen=True)
class PairwiseReport:
    """What :func:`compare_pairwise` measured (``pairwise.json``)."""

    x: str
    y: str
    judge: str
    prompts: int
    pairs: int
    answered: int
    """Pairs with at least one of the two asks answered with A or B."""
    win_rate: tuple[float, float, float]
    length_controlled: tuple[float, float, float]
    position_bias: float
    mean_length_x: float
    mean_length_y: float
    verdicts: list[PairVerdict]

    def to_json(self) -> str:
        data = asdict(self)
        data["verdicts"] = [{**asdict(v), "win": v.win} for v in self.verdicts]
        return json.dumps(data, indent=1, ensure_ascii=False)

    def summary(self) -> str:
        w, lo, hi = self.win_rate
        lc, lc_lo, lc_hi = self.length_controlled
        return (
            f"{self.x} against {self.y} on {self.prompts} prompts, {self.answered} of "
            f"{self.pairs} pairs judged (each in both orders) by {self.judge}:\n"
            f"  win rate {w:.1%} [{lo:.1%}, {hi:.1%}] (95% interval over prompts)\n"
            f"  at equal length {lc:.1%} [{lc_lo:.1%}, {lc_hi:.1%}]; mean length "
            f"{self.mean_length_x:.0f} against {self.mean_length_y:.0f} tokens\n"
            f"  position bias: the answer shown first wins {self.position_bias:.1%}"
        )


def read_eval_samples(eval_dir: Path) -> dict[str, dict[tuple[int, int], dict[str, Any]]]:
    """``completions.jsonl`` of a ``grpokit eval`` output: model label -> (prompt, sample) ->
    row."""
    path = eval_dir / "completions.jsonl"
    if not path.is_file():
        raise UserError(
            f"{path} does not exist: give the output directory of `grpokit eval` (it writes "
            "completions.jsonl there)."
        )
    out: dict[str, dict[tuple[int, int], dict[str, Any]]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            key = (int(row["prompt_index"]), int(row["sample"]))
            out.setdefault(str(row["model"]), {})[key] = row
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(
                f"{path}:{number}: not a completions.jsonl row of grpokit eval ({exc})"
            ) from None
    return out


def pair_keys(
    samples: dict[str, dict[tuple[int, int], dict[str, Any]]],
    x: str,
    y: str,
    max_samples: int | None = None,
) -> list[tuple[int, int]]:
    """The (prompt, sample) pairs both models have, the first ``max_samples`` of each prompt.

    Raises:
        UserError: a label the eval does not have, or no pair in common.
    """
    for label in (x, y):
        if label not in samples:
            raise UserError(
                f"no model {label!r} in the eval's completions (it has: {', '.join(samples)})"
            )
    keys = sorted(set(samples[x]) & set(samples[y]))
    if max_samples is not None:
        keys = [k for k in keys if k[1] < max_samples]
    if not keys:
        raise UserError(f"{x} and {y} share no (prompt, sample) in the eval's completions")
    return keys


def compare_pairwise(
    samples: dict[str, dict[tuple[int, int], dict[str, Any]]],
    x: str,
    y: str,
    backend: JudgeBackend,
    rubric: Rubric,
    keys: Sequence[tuple[int, int]],
) -> tuple[PairwiseReport, list[dict[str, Any]]]:
    """Judge the pairs ``keys`` (:func:`pair_keys`) of X's and Y's samples in both orders; the
    report and every ask (the order shown, the reply and its reading) for
    ``pairwise_replies.jsonl``."""
    asks: list[str] = []
    for key in keys:
        a, b = samples[x][key], samples[y][key]
        for first, second in ((a, b), (b, a)):
            asks.append(
                rubric.render(
                    str(a["prompt"]),
                    "",
                    {"a": first["completion"], "b": second["completion"]},
                )
            )
    replies = backend.complete(asks, logprobs=True)
    verdicts: list[PairVerdict] = []
    records: list[dict[str, Any]] = []
    for i, key in enumerate(keys):
        read: list[float | None] = []
        for j, reply in enumerate(replies[2 * i : 2 * i + 2]):
            p = _read(reply)
            read.append(p if p is None or j == 0 else 1.0 - p)
            records.append(
                {
                    "prompt_index": key[0],
                    "sample": key[1],
                    "shown_first": x if j == 0 else y,
                    "reply": reply.text,
                    "error": reply.error,
                    "p_first": p,
                }
            )
        verdicts.append(
            PairVerdict(
                prompt_index=key[0],
                sample=key[1],
                x_first=read[0],
                y_first=read[1],
                length_x=int(samples[x][key]["length"]),
                length_y=int(samples[y][key]["length"]),
            )
        )
    answered = [v for v in verdicts if v.win is not None]
    report = PairwiseReport(
        x=x,
        y=y,
        judge=backend.description,
        prompts=len({k[0] for k in keys}),
        pairs=len(verdicts),
        answered=len(answered),
        win_rate=win_rate(verdicts),
        length_controlled=length_controlled_win_rate(verdicts),
        position_bias=position_bias(verdicts),
        mean_length_x=statistics.fmean(v.length_x for v in verdicts),
        mean_length_y=statistics.fmean(v.length_y for v in verdicts),
        verdicts=verdicts,
    )
    return report, records


def _read(reply: JudgeReply) -> float | None:
    if reply.text is None:
        return None
    return first_probability(reply.text, reply.tokens or ())
