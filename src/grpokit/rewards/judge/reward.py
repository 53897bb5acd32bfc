"""The judge reward: render the rubric, ask each judge (through the cache), parse, aggregate.

Per call it reports metrics in its result's ``metrics`` (merged into the step's metrics by the
trainer):

- ``judge/parse_failure_rate``: share of judge replies that came back without a usable score;
- ``judge/request_failure_rate``: share of judge requests that failed (timeout, unreachable,
  HTTP error after retries);
- ``judge/none_rate``: share of completions left without any score (their reward is None);
- ``judge/cache_hit_rate``: share of judge scores answered from the cache;
- ``judge/<label>/mean``: each judge's mean normalised score over the completions it scored;
- ``judge/disagreement``: mean over completions of the standard deviation across judges (only
  with an ensemble);
- ``judge/expected_fallback_rate``: in expected mode, share of fresh scores read from the written
  number because the backend returned no usable logprobs;
- ``judge/seconds``: wall time of the call;
- ``judge/<label>/tokens_in``, ``/tokens_out``: tokens the judge's fresh requests used (the
  server's ``usage``; cached answers cost none), ``/cost`` for a judge with prices per million
  tokens; ``judge/tokens_in``, ``judge/tokens_out``, ``judge/cost``: their sums.

With ``scoring: group`` (:mod:`grpokit.rewards.judge.group`) the parse failure rate is the share
of shown answers whose number the judge's group reply gave no score, and two more are logged:

- ``judge/group_parse_failure_rate``: share of group replies that missed at least one answer;
- ``judge/group_size``: mean number of distinct answers shown per group.

When more than ``max_parse_failure_rate`` of a call's replies held no score, it logs a warning
with an example reply (once, until a call is back under the limit); ``rewards check`` prints it.
The result's ``judged`` holds the call's details: each judge's outcomes, the group requests and
that warning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from grpokit.errors import UserError
from grpokit.rewards._base import Reward, RewardBatch, RewardResult
from grpokit.rewards.judge.backends.base import JudgeBackend, JudgeReply
from grpokit.rewards.judge.cache import CachedScore, JudgeCache, cache_key
from grpokit.rewards.judge.config import JudgeParams, LlamaServerJudge, LocalJudge, OpenAIJudge
from grpokit.rewards.judge.expected import expected_score, weighted_score
from grpokit.rewards.judge.group import answers_block, group_order, parse_group_reply
from grpokit.rewards.judge.parse import normalise, parse_score
from grpokit.rewards.judge.rubric import Rubric, load_rubric
from grpokit.rewards.judge.yes_no import parse_yes_no, yes_probability
from grpokit.rewards.text import completion_text, one_line, user_request

logger = logging.getLogger(__name__)

Mode = Literal["number", "expected", "yes_no"]
"""number: the written score; expected: its probability-weighted value from the token
log-probs; yes_no: the probability of yes to a yes/no question (checklist items)."""
Scoring = Literal["absolute", "group"]
"""absolute: each completion judged alone; group: the completions of a prompt in one request."""


def wants_logprobs(mode: Mode) -> bool:
    """Whether a mode reads token log-probabilities (and asks the backend for them)."""
    return mode != "number"


@dataclass
class Judge:
    """One member of the ensemble: a backend with its rubric and scale."""

    label: str
    backend: JudgeBackend
    rubric: Rubric
    score_range: tuple[float, float]
    temperature: float = 0.0
    prices: tuple[float, float] | None = None
    """Price of a million (input, output) tokens, for the cost metric; None: not priced."""

    def scoring_key(self, mode: Mode) -> str:
        low, high = self.score_range
        return f"{mode}:{low:g}:{high:g}"


@dataclass(frozen=True)
class JudgeOutcome:
    """What one judge said about one completion."""

    score: float | None
    """Normalised to [0, 1]; None for a parse or request failure."""
    reply: str | None
    """The judge's text; None when the request failed."""
    error: str | None = None
    cached: bool = False
    fallback: bool = False
    """Expected mode only: scored from the written number because no logprobs came back."""
    usage: tuple[int, int] | None = None
    """(input, output) tokens the request used, as the backend counted them; None when cached
    or not counted. A group request's usage is on the outcome of its first completion only."""
    cached_tokens: int = 0
    """Of the input tokens, those the server took from its prompt cache (with ``usage``)."""
    position: int | None = None
    """Group scoring only: the number (1-based) the completion was shown under."""


@dataclass(frozen=True)
class GroupRecord:
    """One group request of ``scoring: group``: what was shown, in which order, and the reply."""

    judge: str
    rows: tuple[int, ...]
    """The batch rows of the group (the completions of one prompt that reached the judge)."""
    shown: tuple[tuple[int, ...], ...]
    """Per number shown (``shown[n - 1]`` for answer n): the rows whose completion it is
    (several when the policy repeated itself; each distinct text is shown once)."""
    reply: str | None
    """The judge's reply; None when the request failed."""
    missing: tuple[int, ...]
    """The answer numbers the reply gave no usable score."""
    cached: bool = False


@dataclass(frozen=True)
class _GroupPlan:
    """One group request of ``scoring: group`` before it is sent: enough to ask the cache and
    the judge, and to map the scores back to the rows."""

    rows: list[int]
    """The batch rows of the group, in order (see :meth:`JudgeReward.groups`)."""
    shown: list[str]
    """The group's distinct completion texts in the order shown: ``shown[n - 1]`` is answer n."""
    text: str
    """The judge prompt."""
    keys: list[str]
    """The cache key of each answer's score: ``keys[n - 1]`` for answer n."""


def _group_record(
    judge: Judge,
    plan: _GroupPlan,
    texts: Sequence[str],
    per_number: Sequence[JudgeOutcome],
    *,
    cached: bool,
) -> GroupRecord:
    """What a group request showed and what came back, from its outcomes by number."""
    rows_of: dict[str, list[int]] = {}
    for row in plan.rows:
        rows_of.setdefault(texts[row], []).append(row)
    return GroupRecord(
        judge=judge.label,
        rows=tuple(plan.rows),
        shown=tuple(tuple(rows_of[text]) for text in plan.shown),
        reply=per_number[0].reply,
        missing=tuple(o.position or 0 for o in per_number if o.score is None),
        cached=cached,
    )


@dataclass
class JudgedBatch:
    """All judges' outcomes for a batch: ``outcomes[j][i]`` is judge j on completion i."""

    outcomes: list[list[JudgeOutcome]]
    scores: list[float | None]
    metrics: dict[str, float] = field(default_factory=dict)
    groups: list[GroupRecord] = field(default_factory=list)
    """Group scoring only: every group request of every judge."""
    warning: str | None = None
    """The parse-failure warning (see :meth:`JudgeReward.parse_failure_warning`); None when
    the replies were under the limit."""


def score_reply(reply: JudgeReply, mode: Mode, low: float, high: float) -> JudgeOutcome:
    """Turn a backend reply into a normalised score (None when it has none)."""
    outcome = _score_text(reply, mode, low, high)
    if not reply.usage:
        return outcome
    return dataclasses.replace(outcome, usage=reply.usage, cached_tokens=reply.cached_tokens)


def _score_text(reply: JudgeReply, mode: Mode, low: float, high: float) -> JudgeOutcome:
    if reply.text is None:
        return JudgeOutcome(score=None, reply=None, error=reply.error or "no reply")
    if mode == "yes_no":
        if reply.tokens is not None:
            return JudgeOutcome(score=yes_probability(reply.text, reply.tokens), reply=reply.text)
        return JudgeOutcome(score=parse_yes_no(reply.text), reply=reply.text, fallback=True)
    if mode == "expected" and reply.tokens is not None:
        return JudgeOutcome(
            score=expected_score(reply.text, reply.tokens, low, high), reply=reply.text
        )
    return JudgeOutcome(
        score=parse_score(reply.text, low, high),
        reply=reply.text,
        fallback=mode == "expected",
    )


def group_outcomes(
    reply: JudgeReply, count: int, mode: Mode, low: float, high: float
) -> list[JudgeOutcome]:
    """The outcomes of answers 1..count from one group reply (``outcomes[n - 1]`` for answer n);
    the request's usage goes on answer 1's."""
    if reply.text is None:
        error = reply.error or "no reply"
        return [
            JudgeOutcome(score=None, reply=None, error=error, position=n)
            for n in range(1, count + 1)
        ]
    found = parse_group_reply(reply.text, count, low, high)
    outcomes: list[JudgeOutcome] = []
    for n in range(1, count + 1):
        parsed = found.get(n)
        score: float | None = None
        fallback = False
        if parsed is not None:
            if mode == "expected" and reply.tokens is not None:
                score = weighted_score(reply.text, parsed, reply.tokens, low, high)
            else:
                score = normalise(parsed.value, low, high)
                fallback = mode == "expected"
        outcomes.append(
            JudgeOutcome(
                score=score,
                reply=reply.text,
                fallback=fallback,
                position=n,
                usage=reply.usage if n == 1 else None,
                cached_tokens=reply.cached_tokens if n == 1 else 0,
            )
        )
    return outcomes


def row_columns(columns: Mapping[str, Any], row: int, batch: int) -> dict[str, Any]:
    """The dataset column values of one row of a batch (columns with one value per row)."""
    return {
        name: values[row]
        for name, values in columns.items()
        if isinstance(values, Sequence)
        and not isinstance(values, (str, bytes))
        and len(values) == batch
    }


def render_group(
    rubric: Rubric, prompt: Any, shown: Sequence[str], columns: Mapping[str, Any]
) -> str:
    """The judge prompt of one group: the group rubric with the answers in the order shown."""
    values = {**columns, "completions": answers_block(shown), "count": len(shown)}
    return rubric.render(user_request(prompt), "", values)


def usage_metrics(
    judges: Sequence[Judge], outcomes: Sequence[Sequence[JudgeOutcome]]
) -> dict[str, float]:
    """What one call's fresh judge requests used: ``judge/<label>/tokens_in``, ``/tokens_out``,
    ``/tokens_cached`` (input tokens the server's prompt cache answered) and, for a priced
    judge, ``/cost``; their sums ``judge/tokens_in``, ``judge/tokens_out``,
    ``judge/tokens_cached`` and ``judge/cost`` (when any judge is priced). Answers from
    grpokit's own cache cost nothing."""
    metrics: dict[str, float] = {}
    totals = [0.0, 0.0, 0.0, 0.0]
    priced = False
    for judge, row in zip(judges, outcomes, strict=True):
        used_in = sum(o.usage[0] for o in row if o.usage is not None)
        used_out = sum(o.usage[1] for o in row if o.usage is not None)
        from_cache = sum(o.cached_tokens for o in row if o.usage is not None)
        metrics[f"judge/{judge.label}/tokens_in"] = float(used_in)
        metrics[f"judge/{judge.label}/tokens_out"] = float(used_out)
        metrics[f"judge/{judge.label}/tokens_cached"] = float(from_cache)
        totals[0] += used_in
        totals[1] += used_out
        totals[3] += from_cache
        if judge.prices is not None:
            priced = True
            cost = (used_in * judge.prices[0] + used_out * judge.prices[1]) / 1e6
            metrics[f"judge/{judge.label}/cost"] = cost
            totals[2] += cost
    metrics["judge/tokens_in"], metrics["judge/tokens_out"] = totals[0], totals[1]
    metrics["judge/tokens_cached"] = totals[3]
    if priced:
        metrics["judge/cost"] = totals[2]
    return metrics


def aggregate_scores(
    values: Sequence[float | None], how: Literal["mean", "median"]
) -> float | None:
    """Combine the judges' scores of one completion, leaving out those that gave none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.fmean(present) if how == "mean" else statistics.median(present)


class JudgeReward(Reward):
    """An LLM-as-a-judge reward with TRL's calling convention.

    ``reward(prompts, completions, **columns) -> list[float | None]``; a completion no judge
    could score gets None (not 0), which the advantage computation treats as missing.
    """

    def __init__(
        self,
        judges: list[Judge],
        *,
        mode: Mode = "number",
        aggregate: Literal["mean", "median"] = "mean",
        cache: JudgeCache | None = None,
        name: str = "judge",
        max_parse_failure_rate: float = 0.2,
        scoring: Scoring = "absolute",
        shuffle_seed: int = 0,
    ) -> None:
        if not judges:
            raise ValueError("a judge reward needs at least one judge")
        super().__init__(name)
        self.judges = judges
        self.mode = mode
        self.scoring: Scoring = scoring
        self.shuffle_seed = shuffle_seed
        self.aggregate = aggregate
        self.cache = cache
        self.max_parse_failure_rate = max_parse_failure_rate
        self._over_limit = False
        self._pool = ThreadPoolExecutor(max_workers=len(judges), thread_name_prefix="grpokit-judge")

        names: set[str] = set()
        for judge in judges:
            names |= judge.rubric.placeholders
        # Dataset columns the rubrics use (checked against the dataset before training).
        self.required_columns = frozenset(names - {"prompt", "completion", "completions", "count"})

    def evaluate(self, batch: RewardBatch) -> RewardResult:
        judged = self.judge_batch(batch.prompts, batch.completions, batch.columns)
        # Logged when the share first goes over the limit, not at every step while it stays
        # there (judge/parse_failure_rate in the metrics has every step's value).
        if judged.warning is not None and not self._over_limit:
            logger.warning("%s", judged.warning)
        self._over_limit = judged.warning is not None
        return RewardResult(judged.scores, metrics=judged.metrics, judged=judged)

    def parse_failure_warning(self, outcomes: list[list[JudgeOutcome]]) -> str | None:
        """A warning when more than ``max_parse_failure_rate`` of the replies in ``outcomes``
        held no score, with the share and one such reply; None otherwise."""
        answered = [
            (judge, o)
            for judge, row in zip(self.judges, outcomes, strict=True)
            for o in row
            if o.reply is not None
        ]
        failed = [(judge, o) for judge, o in answered if o.score is None]
        if not answered or len(failed) <= self.max_parse_failure_rate * len(answered):
            return None
        judge, example = failed[0]
        missing, ask = _wanted(self.mode, *judge.score_range, scoring=self.scoring)
        return (
            f"{self.__name__}: {len(failed)} of {len(answered)} judge replies "
            f"({len(failed) / len(answered):.0%}) held {missing} "
            f"(max_parse_failure_rate: {self.max_parse_failure_rate:g}); their completions "
            f"get None. Judge {judge.label} ({judge.backend.description}) replied, e.g.: "
            f"{one_line(example.reply or '', 200)!r}. {ask}, raise max_tokens, or use a "
            "stronger judge model."
        )

    def render(
        self,
        judge: Judge,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: Mapping[str, Any],
    ) -> list[str]:
        """The judge prompts of a batch for one judge."""
        if len(prompts) != len(completions):
            raise ValueError(
                f"judge reward: {len(prompts)} prompts but {len(completions)} completions"
            )
        rendered: list[str] = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            row = row_columns(columns, i, len(completions))
            rendered.append(
                judge.rubric.render(user_request(prompt), completion_text(completion), row)
            )
        return rendered

    def groups(
        self, judge: Judge, prompts: Sequence[Any], columns: Mapping[str, Any]
    ) -> list[list[int]]:
        """The batch rows grouped by prompt (and the columns the group rubric shows), in order
        of first appearance: the completions of one prompt that reached the judge."""
        used = sorted(judge.rubric.placeholders - {"prompt", "completions", "count"})
        by_key: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):
            row = row_columns(columns, i, len(prompts))
            key = json.dumps(
                [user_request(prompt), [str(row.get(name)) for name in used]], ensure_ascii=False
            )
            by_key.setdefault(key, []).append(i)
        return list(by_key.values())

    def judge_groups(
        self,
        judge: Judge,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: Mapping[str, Any],
        *,
        use_cache: bool = True,
        salt: int = 0,
    ) -> tuple[list[JudgeOutcome], list[GroupRecord]]:
        """Score a batch with one judge, one request per prompt's group (``scoring: group``).

        Each group's distinct answers are shown in the order :func:`group_order` draws from
        ``shuffle_seed``, ``salt`` and their texts; each answer's score is cached under the
        group prompt and its number, so a group is answered from the cache only whole.
        """
        if len(prompts) != len(completions):
            raise ValueError(
                f"judge reward: {len(prompts)} prompts but {len(completions)} completions"
            )
        texts = [completion_text(c) for c in completions]
        plans = self._plan_groups(judge, prompts, texts, columns, salt)
        cache = self.cache if use_cache else None
        keys = [key for plan in plans for key in plan.keys]
        cached = cache.get_many(keys) if cache is not None else {}
        # Groups differ by prompt, so their judge prompts differ: one request per group.
        todo = [plan for plan in plans if not all(k in cached for k in plan.keys)]
        fresh = self._ask_groups(judge, plans, todo, cache)
        outcomes: list[JudgeOutcome | None] = [None] * len(texts)
        records: list[GroupRecord] = []
        for plan in plans:
            from_cache = plan.text not in fresh
            per_number = (
                [
                    JudgeOutcome(
                        score=cached[key].score, reply=cached[key].reply, cached=True, position=n
                    )
                    for n, key in enumerate(plan.keys, start=1)
                ]
                if from_cache
                else fresh[plan.text]
            )
            index = {text: k for k, text in enumerate(plan.shown)}
            # The request's usage goes on the group's first row only (answer 1 holds it).
            usage = per_number[0].usage
            for k, row in enumerate(plan.rows):
                outcome = per_number[index[texts[row]]]
                outcomes[row] = dataclasses.replace(outcome, usage=usage if k == 0 else None)
            records.append(_group_record(judge, plan, texts, per_number, cached=from_cache))
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None], records

    def _plan_groups(
        self,
        judge: Judge,
        prompts: Sequence[Any],
        texts: Sequence[str],
        columns: Mapping[str, Any],
        salt: int,
    ) -> list[_GroupPlan]:
        """Each group's request (see :meth:`groups`): its distinct answers in the order drawn,
        its judge prompt and the cache key of each answer's score."""
        scoring = "group:" + judge.scoring_key(self.mode)
        identity, digest = judge.backend.identity, judge.rubric.digest
        plans: list[_GroupPlan] = []
        for rows in self.groups(judge, prompts, columns):
            distinct = list(dict.fromkeys(texts[i] for i in rows))
            shown = [distinct[k] for k in group_order(distinct, self.shuffle_seed, salt)]
            text = render_group(
                judge.rubric, prompts[rows[0]], shown, row_columns(columns, rows[0], len(texts))
            )
            keys = [
                cache_key(identity, digest, f"{scoring}:{n}", text)
                for n in range(1, len(shown) + 1)
            ]
            plans.append(_GroupPlan(rows, shown, text, keys))
        return plans

    def _ask_groups(
        self,
        judge: Judge,
        plans: Sequence[_GroupPlan],
        todo: Sequence[_GroupPlan],
        cache: JudgeCache | None,
    ) -> dict[str, list[JudgeOutcome]]:
        """Sends the ``todo`` groups' prompts to the judge: per judge prompt, the outcomes of its
        answers by number. The scores of the answered ones are stored in ``cache`` (when there
        is one)."""
        if not todo:
            return {}
        low, high = judge.score_range
        replies = judge.backend.complete(
            [plan.text for plan in todo], logprobs=wants_logprobs(self.mode)
        )
        # Keyed by judge prompt: a group rubric must show {completions}, so groups with the same
        # prompt show the same answers and share one outcome list.
        fresh = {
            plan.text: group_outcomes(reply, len(plan.shown), self.mode, low, high)
            for plan, reply in zip(todo, replies, strict=True)
        }
        to_store: dict[str, CachedScore] = {}
        for plan in plans:
            for key, outcome in zip(plan.keys, fresh.get(plan.text, []), strict=False):
                if outcome.reply is not None:
                    to_store[key] = CachedScore(outcome.score, outcome.reply)
        if cache is not None:
            cache.put_many(judge.label, to_store)
        return fresh

    def _cache_keys(self, judge: Judge, texts: Sequence[str]) -> list[str]:
        scoring = judge.scoring_key(self.mode)
        return [
            cache_key(judge.backend.identity, judge.rubric.digest, scoring, text) for text in texts
        ]

    def uncached(self, judge: Judge, texts: Sequence[str]) -> list[str]:
        """The judge prompts among ``texts`` that the cache cannot answer (all without one)."""
        if self.cache is None:
            return list(texts)
        keys = self._cache_keys(judge, texts)
        hits = self.cache.get_many(keys)
        return [text for key, text in zip(keys, texts, strict=True) if key not in hits]

    def judge_prompts(
        self, judge: Judge, texts: Sequence[str], *, use_cache: bool = True
    ) -> list[JudgeOutcome]:
        """Score already rendered judge prompts with one judge: cache, then the backend."""
        keys = self._cache_keys(judge, texts)
        cached = self.cache.get_many(keys) if (self.cache is not None and use_cache) else {}
        # Identical judge prompts in one batch (a policy repeating itself) are asked once.
        todo: dict[str, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key not in cached and key not in todo:
                todo[key] = text
        fresh: dict[str, JudgeOutcome] = {}
        if todo:
            low, high = judge.score_range
            replies = judge.backend.complete(
                list(todo.values()), logprobs=wants_logprobs(self.mode)
            )
            to_store: dict[str, CachedScore] = {}
            for key, reply in zip(todo, replies, strict=True):
                outcome = score_reply(reply, self.mode, low, high)
                fresh[key] = outcome
                if outcome.reply is not None:
                    to_store[key] = CachedScore(outcome.score, outcome.reply)
            if self.cache is not None and use_cache:
                self.cache.put_many(judge.label, to_store)
        outcomes: list[JudgeOutcome] = []
        for key in keys:
            if key in cached:
                hit = cached[key]
                outcomes.append(JudgeOutcome(score=hit.score, reply=hit.reply, cached=True))
            else:
                outcomes.append(fresh[key])
        return outcomes

    def judge_batch(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: Mapping[str, Any],
        *,
        use_cache: bool = True,
        shuffle_salt: int = 0,
    ) -> JudgedBatch:
        """Score a batch with every judge (judges run in parallel) and aggregate.

        ``shuffle_salt``: group scoring draws each group's order from the seed, this salt and
        the answers; another salt shows the same group in another order (an audit's repeats).
        """
        started = time.perf_counter()
        records: list[GroupRecord] = []
        if self.scoring == "group":
            group_futures = [
                self._pool.submit(
                    self.judge_groups,
                    judge,
                    prompts,
                    completions,
                    columns,
                    use_cache=use_cache,
                    salt=shuffle_salt,
                )
                for judge in self.judges
            ]
            outcomes = []
            for future in group_futures:
                judged, judge_records = future.result()
                outcomes.append(judged)
                records += judge_records
        else:
            rendered = [self.render(judge, prompts, completions, columns) for judge in self.judges]
            futures = [
                self._pool.submit(self.judge_prompts, judge, texts, use_cache=use_cache)
                for judge, texts in zip(self.judges, rendered, strict=True)
            ]
            outcomes = [future.result() for future in futures]
        per_item = [
            [outcomes[j][i].score for j in range(len(self.judges))] for i in range(len(completions))
        ]
        scores = [aggregate_scores(values, self.aggregate) for values in per_item]
        metrics = self._metrics(outcomes, per_item, scores)
        if records:
            answered_groups = [r for r in records if r.reply is not None]
            metrics["judge/group_parse_failure_rate"] = (
                sum(bool(r.missing) for r in answered_groups) / len(answered_groups)
                if answered_groups
                else 0.0
            )
            metrics["judge/group_size"] = statistics.fmean(len(r.shown) for r in records)
        metrics["judge/seconds"] = time.perf_counter() - started
        failures = [o.error for row in outcomes for o in row if o.error is not None]
        # Group scoring sends one request per group: count those, not the completions.
        requests = len(records) if records else sum(len(row) for row in outcomes)
        failed = sum(r.reply is None for r in records) if records else len(failures)
        if failures:
            logger.warning(
                "judge: %d of %d requests failed (first: %s); those scores are None",
                failed,
                requests,
                failures[0],
            )
        return JudgedBatch(
            outcomes=outcomes,
            scores=scores,
            metrics=metrics,
            groups=records,
            warning=self.parse_failure_warning(outcomes),
        )

    def _metrics(
        self,
        outcomes: list[list[JudgeOutcome]],
        per_item: list[list[float | None]],
        scores: list[float | None],
    ) -> dict[str, float]:
        flat = [o for row in outcomes for o in row]
        if not flat:
            return {}
        answered = [o for o in flat if o.reply is not None]
        metrics: dict[str, float] = {
            "judge/parse_failure_rate": (
                sum(o.score is None for o in answered) / len(answered) if answered else 0.0
            ),
            "judge/request_failure_rate": sum(o.reply is None for o in flat) / len(flat),
            "judge/none_rate": sum(s is None for s in scores) / len(scores),
            "judge/cache_hit_rate": sum(o.cached for o in flat) / len(flat),
        }
        for judge, row in zip(self.judges, outcomes, strict=True):
            values = [o.score for o in row if o.score is not None]
            metrics[f"judge/{judge.label}/mean"] = statistics.fmean(values) if values else math.nan
        metrics.update(usage_metrics(self.judges, outcomes))
        if len(self.judges) > 1:
            spreads = [
                statistics.pstdev(present)
                for present in ([v for v in item if v is not None] for item in per_item)
                if len(present) > 1
            ]
            metrics["judge/disagreement"] = statistics.fmean(spreads) if spreads else math.nan
        if wants_logprobs(self.mode):
            fresh = [o for o in answered if not o.cached]
            metrics["judge/expected_fallback_rate"] = (
                sum(o.fallback for o in fresh) / len(fresh) if fresh else 0.0
            )
        return metrics

    def close(self) -> None:
        """Release the judges' connections and models and the cache."""
        self._pool.shutdown(wait=True)
        for judge in self.judges:
            judge.backend.close()
        if self.cache is not None:
            self.cache.close()


def default_cache_path(cache_path: str | None, base_dir: Path, run_dir: Path | None) -> Path:
    """Where the cache lives: the configured path, the run directory, or the grpokit cache."""
    if cache_path is not None:
        path = Path(cache_path).expanduser()
        return path if path.is_absolute() else base_dir / path
    if run_dir is not None:
        return run_dir / "judge_cache.sqlite"
    env = os.environ.get("GRPOKIT_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "grpokit"
    return root / "judge_cache.sqlite"


# The fixed sample a judge scores at start-up (check_at_start). It holds no digits, so a number
# in the reply is the judge's own, not one copied from the text. Dataset columns a rubric shows
# (a reference answer ...) get the sample's answer.
START_PROMPT = "Name the capital of France."
START_COMPLETION = "The capital of France is Paris."
START_COLUMN_VALUE = "Paris"
START_WRONG_COMPLETION = "The capital of France is Berlin."
"""The second answer of the start-up group (scoring: group): a wrong one beside the right one."""


def _wanted(
    mode: Mode, low: float, high: float, *, scoring: Scoring = "absolute"
) -> tuple[str, str]:
    """What a reply lacks when it holds no score, and what to ask of the rubric."""
    if mode == "yes_no":
        return "no yes or no", "Make the question ask for a yes or no answer"
    if scoring == "group":
        return (
            f"no score on the {low:g}-{high:g} scale for some answers",
            "Make the group rubric ask for one line `N: score` per answer on that scale",
        )
    return (
        f"no score on the {low:g}-{high:g} scale",
        "Make the rubric ask for one number on that scale",
    )


def check_judge_scores(
    judge: Judge,
    mode: Mode,
    where: str,
    *,
    need_score: bool = True,
    require_logprobs: bool = False,
    scoring: Scoring = "absolute",
) -> None:
    """Score the fixed start-up sample with one real request (no cache); with group scoring,
    the group of that sample and a wrong answer, which must both get a score.

    Raises:
        UserError: naming the judge, its endpoint and model, and the server's answer, when the
            request fails, (``need_score``) when the reply holds no score, or
            (``require_logprobs``, in a mode that reads them) when it came without token
            log-probabilities, so that every score would be the written answer.
    """
    columns = {name: START_COLUMN_VALUE for name in judge.rubric.placeholders}
    low, high = judge.score_range
    if scoring == "group":
        shown = [START_COMPLETION, START_WRONG_COMPLETION]
        text = render_group(judge.rubric, START_PROMPT, shown, columns)
        reply = judge.backend.complete([text], logprobs=wants_logprobs(mode))[0]
        pair = group_outcomes(reply, len(shown), mode, low, high)
        # The outcome that lacks a score, if any, speaks for the pair.
        outcome = next((o for o in pair if o.score is None), pair[0])
        sample = f"{START_PROMPT!r} answered {START_COMPLETION!r} and {START_WRONG_COMPLETION!r}"
    else:
        text = judge.rubric.render(START_PROMPT, START_COMPLETION, columns)
        reply = judge.backend.complete([text], logprobs=wants_logprobs(mode))[0]
        outcome = score_reply(reply, mode, low, high)
        sample = f"{START_PROMPT!r} answered {START_COMPLETION!r}"
    who = f"{where} (judge {judge.label}: {judge.backend.description})"
    if outcome.reply is None:
        raise UserError(
            f"{who}: the start-up scoring request failed: {outcome.error}. Check base_url, "
            "model, the key and extra_body against the server's documentation, or set "
            "check_at_start: false to start anyway."
        )
    if outcome.score is None and need_score:
        missing, ask = _wanted(mode, low, high, scoring=scoring)
        raise UserError(
            f"{who}: the reply to a start-up sample ({sample}) holds {missing}: "
            f"{one_line(outcome.reply, 300)!r}. {ask}, "
            "raise max_tokens (an empty reply is often a limit spent before the answer; "
            "reasoning models need max_completion_tokens in the thousands), or set "
            "check_at_start: false to start anyway."
        )
    if require_logprobs and wants_logprobs(mode) and reply.tokens is None:
        raise UserError(
            f"{who}: `mode: {mode}` reads the judge's token log-probabilities, but its reply "
            "to the start-up sample came without them, so every score would be the written "
            "answer alone. Use a server that returns logprobs (llama.cpp, vLLM and OpenAI's "
            "chat models do), or set require_logprobs: false to accept the written answers."
        )


def judge_prices(spec: OpenAIJudge | LocalJudge) -> tuple[float, float] | None:
    """A judge's prices per million (input, output) tokens; None when neither is set (an
    unset one of the two counts as free)."""
    if not isinstance(spec, OpenAIJudge):
        return None
    prices = (spec.price_per_million_input_tokens, spec.price_per_million_output_tokens)
    if prices == (None, None):
        return None
    return (prices[0] or 0.0, prices[1] or 0.0)


def build_backend(
    spec: OpenAIJudge | LocalJudge, where: str, base_dir: Path | None = None
) -> JudgeBackend:
    """Construct (and for HTTP, contact; for ``llama_server``, start) one judge's backend;
    ``base_dir``: what a served model's relative path is relative to (the config's folder)."""
    if isinstance(spec, LlamaServerJudge):
        from grpokit.rewards.judge.backends.served import ServedBackend

        return ServedBackend(spec, where=where, base_dir=base_dir)
    if isinstance(spec, OpenAIJudge):
        from grpokit.rewards.judge.backends.openai import OpenAIBackend

        backend = OpenAIBackend(spec, where=where)
        if spec.check_at_start:
            try:
                backend.check_reachable()
            except UserError:
                backend.close()
                raise
        return backend
    from grpokit.rewards.judge.backends.local import LocalBackend

    return LocalBackend(spec, where=where)


def build_judge_reward(
    params: JudgeParams,
    base_dir: Path,
    run_dir: Path | None = None,
    *,
    where: str = "judge",
    name: str = "judge",
    start_sample_must_score: bool = True,
) -> JudgeReward:
    """Build a judge reward from its params; every user error surfaces here, before training.

    Checks: each rubric exists and has {completion}; API key variables are set; HTTP endpoints
    answer and score a fixed sample (unless ``check_at_start`` is off; a reply without a score
    is an error unless ``start_sample_must_score`` is False, as for an audit, whose job is to
    measure such replies); local models load.
    """
    rubrics: list[Rubric] = []
    for i, spec in enumerate(params.judges):
        if params.scoring == "group":
            rubrics.append(
                load_rubric(
                    params.group_rubric,
                    params.group_rubric_file,
                    base_dir,
                    f"{where}.group_rubric",
                    placeholder="completions",
                )
            )
        elif spec.rubric is not None or spec.rubric_file is not None:
            rubrics.append(
                load_rubric(spec.rubric, spec.rubric_file, base_dir, f"{where}.judges[{i}]")
            )
        else:
            rubrics.append(load_rubric(params.rubric, params.rubric_file, base_dir, where))
    judges: list[Judge] = []
    try:
        for i, (spec, rubric) in enumerate(zip(params.judges, rubrics, strict=True)):
            backend = build_backend(spec, f"{where}.judges[{i}]", base_dir)
            judges.append(
                Judge(
                    label=spec.name if spec.name is not None else str(i),
                    backend=backend,
                    rubric=rubric,
                    score_range=spec.score_range or params.score_range,
                    temperature=spec.temperature,
                    prices=judge_prices(spec),
                )
            )
            if isinstance(spec, OpenAIJudge) and spec.check_at_start:
                check_judge_scores(
                    judges[-1],
                    params.mode,
                    f"{where}.judges[{i}]",
                    need_score=start_sample_must_score,
                    require_logprobs=params.require_logprobs and start_sample_must_score,
                    scoring=params.scoring,
                )
        cache = (
            JudgeCache(default_cache_path(params.cache_path, base_dir, run_dir))
            if params.cache
            else None
        )
    except BaseException:
        for judge in judges:
            judge.backend.close()
        raise
    return JudgeReward(
        judges,
        mode=params.mode,
        aggregate=params.aggregate,
        cache=cache,
        name=name,
        max_parse_failure_rate=params.max_parse_failure_rate,
        scoring=params.scoring,
        shuffle_seed=params.shuffle_seed,
    )
