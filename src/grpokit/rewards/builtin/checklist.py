"""``checklist``: a reward made of pass/fail items, each checked by a program or asked of a judge.

Each item has a name, a weight and one check:

- a program: ``function`` (``file.py:fn`` with TRL's convention, values in [0, 1]), ``regex``
  (found in the completion), ``json_schema`` (the first JSON value in the completion is valid
  against it) or a length condition (``min_chars`` and/or ``max_chars``);
- or a yes/no ``question`` to the configured judge(s), scored as the judge's probability of
  "yes" from its token log-probabilities (the parsed yes/no where a backend gives none).

The reward is the weighted mean of the item scores a completion has (items that gave None are
left out). A 0/1 item is the kind of success GRPO amplifies best; each item's mean over a batch
is logged as ``checklist/<item>/pass_rate`` (and ``eval/checklist/<item>/pass_rate`` on held-out
prompts), so the success rates the theory speaks of are watched one by one.

An item may carry a ``gate:`` as rewards do: on an earlier item of the same checklist or on
another reward of the set (``gate: {reward: xml_format, min: 1.0}``); where it stays closed the
item is not checked (a question is not sent) and scores ``otherwise``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpokit.errors import UserError
from grpokit.rewards._base import Reward, RewardBatch, RewardResult, check_result
from grpokit.rewards.builtin.match import JsonSchema, JsonSchemaParams
from grpokit.rewards.builtin.python_fn import load_function
from grpokit.rewards.judge.backends.ahead import AskAheadBackend
from grpokit.rewards.judge.config import JudgeSpec, OpenAIJudge
from grpokit.rewards.judge.rubric import Rubric
from grpokit.rewards.registry import BuildContext, register_reward
from grpokit.rewards.spec import GateSpec
from grpokit.rewards.text import completion_text

if TYPE_CHECKING:
    from grpokit.rewards.judge.reward import JudgeReward

_NAME_RE = re.compile(r"^[A-Za-z0-9_\-]+$")
_CHECKS = ("function", "regex", "json_schema", "length", "question")


class ChecklistItem(BaseModel):
    """One item of a checklist: a name, a weight and exactly one check."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        description="The item's name in metrics (checklist/<name>/pass_rate) and in item gates: "
        "letters, digits, '_' and '-'."
    )
    weight: float = Field(
        default=1.0, ge=0.0, description="The item's weight in the checklist's weighted mean."
    )
    function: str | None = Field(
        default=None,
        description="A program check: `file.py:function` (relative to the config) or "
        "`module:function`, with TRL's convention fn(prompts, completions, **columns) returning "
        "one value in [0, 1] (or None) per completion.",
    )
    columns: list[str] = Field(
        default_factory=list,
        description="Dataset columns the function reads; checked before training starts.",
    )
    regex: str | None = Field(
        default=None,
        description="A program check: passes where this Python regular expression is found in "
        "the completion (write (?i) at its start to ignore case).",
    )
    json_schema: dict[str, Any] | None = Field(
        default=None,
        description="A program check: passes where the first JSON value in the completion is "
        "valid against this JSON Schema (written inline).",
    )
    min_chars: int | None = Field(
        default=None, ge=0, description="A length check: at least this many characters."
    )
    max_chars: int | None = Field(
        default=None, ge=0, description="A length check: at most this many characters."
    )
    question: str | None = Field(
        default=None,
        description="A judge check: a yes/no question with {completion} (and optionally "
        "{prompt} or dataset columns); the score is the judge's probability of yes.",
    )
    gate: GateSpec | None = Field(
        default=None,
        description="Check this item only where an earlier item of this checklist, or another "
        "reward of the set, reached a threshold; elsewhere it scores `otherwise`.",
    )

    @property
    def checks(self) -> list[str]:
        """The kinds of check this item declares (valid items have exactly one)."""
        given = {
            "function": self.function is not None,
            "regex": self.regex is not None,
            "json_schema": self.json_schema is not None,
            "length": self.min_chars is not None or self.max_chars is not None,
            "question": self.question is not None,
        }
        return [kind for kind in _CHECKS if given[kind]]

    @model_validator(mode="after")
    def _one_check(self) -> ChecklistItem:
        label = f"item {self.name!r}"
        if not _NAME_RE.match(self.name):
            raise ValueError(
                f"{label}: a name may contain only letters, digits, '_' and '-' (it becomes "
                "part of the metric checklist/<name>/pass_rate)"
            )
        checks = self.checks
        if len(checks) != 1:
            found = f"it has {', '.join(checks)}" if checks else "it has none"
            raise ValueError(
                f"{label}: give exactly one check, a program (function, regex, json_schema, "
                f"min_chars/max_chars) or a judge question ({found})"
            )
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(
                    f"{label}: regex {self.regex!r} is not a valid regular expression: {exc}"
                ) from None
        if self.json_schema is not None:
            try:
                JsonSchemaParams.model_validate({"schema": self.json_schema})
            except ValueError as exc:
                raise ValueError(f"{label}: json_schema is not a valid JSON Schema") from exc
        if (
            self.min_chars is not None
            and self.max_chars is not None
            and self.min_chars > self.max_chars
        ):
            raise ValueError(f"{label}: min_chars is larger than max_chars")
        if self.question is not None:
            rubric = Rubric(template=self.question, source=label)
            if "completion" not in rubric.placeholders:
                raise ValueError(
                    f"{label}: the question has no {{completion}} placeholder, so the judge "
                    "would never see the text it checks; put {completion} where the answer goes"
                )
        if self.function is None and self.columns:
            raise ValueError(f"{label}: columns are read by a function check only")
        return self


class ChecklistParams(BaseModel):
    """Parameters of ``checklist``."""

    model_config = ConfigDict(extra="forbid")

    items: list[ChecklistItem] = Field(
        min_length=1, description="The items, each with a name, a weight and one check."
    )
    judges: list[JudgeSpec] = Field(
        default_factory=list,
        description="The judge(s) that answer the items' questions (as in `type: judge`; their "
        "prompt is each item's question, so they take no rubric). Required when an item asks "
        "a question.",
    )
    aggregate: Literal["mean", "median"] = Field(
        default="mean",
        description="How several judges' probabilities of yes for one item are combined.",
    )
    require_logprobs: bool = Field(
        default=True,
        description="Stop before training when a judge's start-up reply (check_at_start) comes "
        "without token log-probabilities, instead of scoring every question from the written "
        "yes or no; false accepts the written answers.",
    )
    cache: bool = Field(
        default=True,
        description="Keep the judge's answers in a SQLite cache (see `type: judge`).",
    )
    cache_path: str | None = Field(
        default=None,
        description="Where the cache lives, relative to the config file; default as for "
        "`type: judge`.",
    )
    max_parse_failure_rate: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Warn when more than this share of one item's judge replies held no yes or no.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ChecklistParams:
        seen: list[str] = []
        for item in self.items:
            if item.name in seen:
                raise ValueError(f"two items are named {item.name!r}; give each a distinct name")
            gate = item.gate
            if gate is not None and gate.reward == item.name:
                raise ValueError(f"item {item.name!r} is gated on itself")
            seen.append(item.name)
        later = {item.name: i for i, item in enumerate(self.items)}
        for i, item in enumerate(self.items):
            if item.gate is not None and later.get(item.gate.reward, -1) > i:
                raise ValueError(
                    f"item {item.name!r} is gated on item {item.gate.reward!r}, which comes "
                    "after it; put the item it depends on first"
                )
        asks = [item.name for item in self.items if item.question is not None]
        if asks and not self.judges:
            raise ValueError(
                f"item {asks[0]!r} asks a question but no judge is configured: add `judges:` "
                "(e.g. - {backend: openai, base_url: ..., model: ...})"
            )
        for i, judge in enumerate(self.judges):
            if judge.rubric is not None or judge.rubric_file is not None:
                raise ValueError(
                    f"judges[{i}]: a checklist's judges are asked each item's question; "
                    "remove rubric / rubric_file"
                )
        return self

    def reward_dependencies(self) -> list[str]:
        """The other rewards the items' gates read (item gates on items are internal)."""
        names = {item.name for item in self.items}
        out: list[str] = []
        for item in self.items:
            if item.gate is not None and item.gate.reward not in names:
                out.append(item.gate.reward)
        return list(dict.fromkeys(out))


Check = Callable[[RewardBatch], RewardResult]
"""The rows an item checks -> one score each (and, for a question, the judge's metrics)."""


def _program_check(item: ChecklistItem, base_dir: Path) -> Check:
    """The check function of a program item."""
    if item.function is not None:
        fn = load_function(item.function, base_dir)
        label = f"checklist item {item.name!r}"

        def run_function(batch: RewardBatch) -> RewardResult:
            returned = fn(prompts=batch.prompts, completions=batch.completions, **batch.keywords())
            values = check_result(label, returned, len(batch.completions))
            for value in values:
                if value is not None and not 0.0 <= value <= 1.0:
                    raise ValueError(f"{label} returned {value}; an item's score is in [0, 1]")
            return RewardResult(values)

        return run_function
    if item.regex is not None:
        pattern = re.compile(item.regex)
        return _per_text(lambda text: pattern.search(text) is not None)
    if item.json_schema is not None:
        params = JsonSchemaParams.model_validate(
            {"schema": item.json_schema, "allow_surrounding_text": True}
        )
        schema = JsonSchema(params, item.json_schema)
        return _per_text(lambda text: schema.score_one(text) >= 1.0)
    low = item.min_chars if item.min_chars is not None else 0
    high = item.max_chars if item.max_chars is not None else math.inf
    return _per_text(lambda text: low <= len(text.strip()) <= high)


def _per_text(passes: Callable[[str], bool]) -> Check:
    def check(batch: RewardBatch) -> RewardResult:
        return RewardResult([1.0 if passes(completion_text(c)) else 0.0 for c in batch.completions])

    return check


def _open_rows(source: Sequence[float | None], minimum: float) -> list[int]:
    """The rows whose gate value is present and at least ``minimum``."""
    return [i for i, v in enumerate(source) if v is not None and v >= minimum]


def _per_row(batch: RewardBatch) -> RewardBatch:
    """``batch`` with only its per-row columns (sequences of the batch's length): called
    through TRL's convention, it may hold other keywords (``trainer_state``)."""
    size = len(batch.completions)
    columns = {
        k: v
        for k, v in batch.columns.items()
        if isinstance(v, Sequence) and not isinstance(v, (str, bytes)) and len(v) == size
    }
    return dataclasses.replace(batch, columns=columns)


def weighted_mean(scores: Sequence[float | None], weights: Sequence[float]) -> float | None:
    """The weighted mean of the item scores that are not None; None when none is (or when their
    weights sum to 0).

    >>> weighted_mean([1.0, None, 0.0], [3.0, 1.0, 1.0])
    0.75
    """
    present = [(s, w) for s, w in zip(scores, weights, strict=True) if s is not None]
    total = sum(w for _, w in present)
    if not present or total <= 0:
        return None
    return sum(s * w for s, w in present) / total


class Checklist(Reward):
    """The ``checklist`` reward (see the module's docstring)."""

    def __init__(
        self,
        items: list[ChecklistItem],
        checks: list[Check],
        judged: dict[str, JudgeReward],
        backends: Sequence[AskAheadBackend] = (),
        name: str = "checklist",
    ) -> None:
        super().__init__(name)
        self.items = items
        self.checks = checks
        self.judged = judged
        """The question items' judge rewards (one per item, sharing backends and cache)."""
        self.backends = list(backends)
        """The judges' backends, one per configured judge, shared by the question items."""
        self.part_names = tuple(f"checklist/{item.name}" for item in items)
        names = {item.name for item in items}
        self.reads_rewards = frozenset(
            item.gate.reward
            for item in items
            if item.gate is not None and item.gate.reward not in names
        )
        columns: set[str] = set()
        for item in items:
            columns |= set(item.columns)
        for reward in judged.values():
            columns |= reward.required_columns
        self.required_columns = frozenset(columns)

    def evaluate(self, batch: RewardBatch) -> RewardResult:
        batch = _per_row(batch)
        started = time.perf_counter()
        asked = self._ask_ahead(batch)
        ahead_seconds = time.perf_counter() - started
        try:
            result = self._score(batch)
        finally:
            for backend in self.backends:
                backend.forget()
        if asked:
            result.metrics["judge/ask_ahead_seconds"] = ahead_seconds
        return result

    def _ask_ahead(self, batch: RewardBatch) -> bool:
        """Ask every question whose rows are known before the items run (no gate, or a gate on
        another reward), completion by completion, so that a server's prompt cache serves each
        completion's later questions (see AskAheadBackend); whether any was asked. Items gated
        on an earlier item are asked in their turn."""
        from grpokit.rewards.judge.reward import wants_logprobs

        asks: dict[tuple[AskAheadBackend, bool], list[tuple[int, int, str]]] = {}
        for position, item in enumerate(self.items):
            reward = self.judged.get(item.name)
            if reward is None:
                continue
            rows = list(range(len(batch.completions)))
            if item.gate is not None:
                source = batch.reward_values.get(item.gate.reward)
                if source is None:
                    continue
                rows = _open_rows(source, item.gate.min)
            if not rows:
                continue
            sub = batch.select(rows)
            for judge in reward.judges:
                backend = judge.backend
                if not isinstance(backend, AskAheadBackend):
                    continue
                texts = reward.render(judge, sub.prompts, sub.completions, sub.columns)
                wanted = set(reward.uncached(judge, texts))
                asks.setdefault((backend, wants_logprobs(reward.mode)), []).extend(
                    (row, position, text)
                    for row, text in zip(rows, texts, strict=True)
                    if text in wanted
                )
        for (backend, logprobs), entries in asks.items():
            backend.ask_ahead([text for *_, text in sorted(entries)], logprobs=logprobs)
        return bool(asks)

    def _score(self, batch: RewardBatch) -> RewardResult:
        size = len(batch.completions)
        item_scores: dict[str, list[float | None]] = {}
        metrics: dict[str, float] = {}
        for item, check in zip(self.items, self.checks, strict=True):
            rows = list(range(size))
            scores: list[float | None] = [None] * size
            if item.gate is not None:
                source = item_scores.get(item.gate.reward)
                if source is None:
                    source = batch.reward_values.get(item.gate.reward)
                if source is None:
                    raise UserError(
                        f"checklist item {item.name!r} is gated on the reward "
                        f"{item.gate.reward!r}, whose values were not passed: gates on other "
                        "rewards work inside grpokit's reward set (grpokit train/eval), not when "
                        "the checklist is called alone"
                    )
                rows = _open_rows(source, item.gate.min)
                scores = [item.gate.otherwise] * size
            if rows:
                checked = check(batch.select(rows))
                for row, value in zip(rows, checked.values, strict=True):
                    scores[row] = value
                # A question's judge reports its metrics; a program check reports none.
                for key, value in checked.metrics.items():
                    head, _, tail = key.partition("/")
                    metrics[f"{head}/{item.name}/{tail}"] = value
            item_scores[item.name] = scores
        for kind in ("tokens_in", "tokens_out", "tokens_cached", "cost"):
            per_item = [metrics.get(f"judge/{name}/{kind}") for name in self.judged]
            if any(v is not None for v in per_item):
                metrics[f"judge/{kind}"] = sum(v for v in per_item if v is not None)
        weights = [item.weight for item in self.items]
        values = [
            weighted_mean([item_scores[item.name][i] for item in self.items], weights)
            for i in range(size)
        ]
        parts = {f"checklist/{item.name}": item_scores[item.name] for item in self.items}
        return RewardResult(values, parts=parts, metrics=metrics)

    def close(self) -> None:
        for reward in self.judged.values():
            reward.close()


def _question_rewards(
    params: ChecklistParams, ctx: BuildContext, where: str
) -> tuple[dict[str, JudgeReward], list[AskAheadBackend]]:
    """One yes/no judge reward per question item, and the backends they share (one per judge;
    the cache is shared too)."""
    from grpokit.rewards.judge.cache import JudgeCache
    from grpokit.rewards.judge.reward import (
        Judge,
        JudgeReward,
        build_backend,
        check_judge_scores,
        default_cache_path,
        judge_prices,
    )

    asks = [(i, item) for i, item in enumerate(params.items) if item.question is not None]
    if not asks:
        return {}, []
    backends: list[AskAheadBackend] = []
    rewards: dict[str, JudgeReward] = {}
    try:
        for i, spec in enumerate(params.judges):
            backends.append(
                AskAheadBackend(build_backend(spec, f"{where}.judges[{i}]", ctx.base_dir))
            )
        cache = None
        if params.cache:
            cache = JudgeCache(default_cache_path(params.cache_path, ctx.base_dir, ctx.run_dir))
        for i, item in asks:
            assert item.question is not None
            rubric = Rubric(template=item.question, source=f"{where}.items[{i}].question")
            judges = [
                Judge(
                    label=spec.name if spec.name is not None else str(j),
                    backend=backend,
                    rubric=rubric,
                    score_range=(0.0, 1.0),
                    temperature=spec.temperature,
                    prices=judge_prices(spec),
                )
                for j, (spec, backend) in enumerate(zip(params.judges, backends, strict=True))
            ]
            for j, (spec, judge) in enumerate(zip(params.judges, judges, strict=True)):
                if isinstance(spec, OpenAIJudge) and spec.check_at_start:
                    check_judge_scores(
                        judge,
                        "yes_no",
                        f"{where}.items[{i}] ({item.name}), judges[{j}]",
                        require_logprobs=params.require_logprobs,
                    )
            rewards[item.name] = JudgeReward(
                judges,
                mode="yes_no",
                aggregate=params.aggregate,
                cache=cache,
                name=f"checklist/{item.name}",
                max_parse_failure_rate=params.max_parse_failure_rate,
            )
    except BaseException:
        for backend in backends:
            backend.close()
        raise
    return rewards, backends


def build_checklist(
    params: ChecklistParams, ctx: BuildContext, where: str = "checklist"
) -> Checklist:
    """Build the checks (importing functions, contacting judges) before training starts."""
    judged, backends = _question_rewards(params, ctx, where)
    checks: list[Check] = []
    try:
        for item in params.items:
            reward = judged.get(item.name)
            if reward is not None:
                checks.append(reward.evaluate)
            else:
                checks.append(_program_check(item, ctx.base_dir))
    except BaseException:
        for reward in judged.values():
            reward.close()
        raise
    return Checklist(list(params.items), checks, judged, backends)


register_reward("checklist", ChecklistParams, lambda params, ctx: build_checklist(params, ctx))
