"""What preflight measures on a batch of sampled, scored completions: plain records, no I/O.

Everything here is computed from the :class:`~grpokit.train.scoring.ScoredBatch` records that
``sample_and_score`` returns, i.e. from exactly the sampling and scoring a training step does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.core.forecast import Forecast, forecast, std_normalized_for
from grpokit.core.stats import wilson_interval, zero_variance_share
from grpokit.rewards.builtin.format import tags_present_score
from grpokit.rewards.compose import RewardScores
from grpokit.sampling.scoring import ScoredBatch, merge_scores, summarize


@dataclass(frozen=True)
class RewardInfo:
    """What the verdict needs to know about one configured reward (from its YAML entry)."""

    name: str
    type: str
    weight: float = 1.0
    max_value: float | None = 1.0
    tags: tuple[str, ...] | None = None
    """The required tags of a format reward (xml_format, tags_present); None otherwise."""
    gate: str | None = None
    """Name of the reward this one is gated on."""


@dataclass(frozen=True)
class DrawRecord:
    """One preflight draw: how many groups of what size, how their completions were sampled
    (SamplingParams' subset that preflight reports) and what training would do with them;
    preflight.json's ``settings``, less the system prompt."""

    prompts: int
    generations: int
    temperature: float
    top_p: float
    top_k: int
    max_completion_length: int
    beta: float
    scale_rewards: str
    system_prompt: str | None
    seed: int

    @property
    def samples(self) -> int:
        return self.prompts * self.generations


@dataclass(frozen=True)
class RewardStats:
    """One reward over all samples.

    mean: over applicable samples (not None; gated-out samples count with their `otherwise`
    value, as in training). passed: samples at the reward's maximum (None without a maximum).
    interval: 95% Wilson interval of the pass rate. zero_variance_share: share of groups whose
    values of this reward are all equal. none_share: share of samples where the reward returned
    None (a parse failure or "not applicable"). gated_out_share: share not computed because the
    gate stayed closed.
    """

    name: str
    samples: int
    applicable: int
    mean: float
    passed: int | None
    interval: tuple[float, float] | None
    zero_variance_share: float
    none_share: float
    gated_out_share: float
    forecast: Forecast | None = None

    @property
    def pass_rate(self) -> float | None:
        if self.passed is None or not self.applicable:
            return None
        return self.passed / self.applicable


@dataclass(frozen=True)
class PartStats:
    """One part of a reward (a checklist item) over the samples its reward scored.

    scored: samples where the reward ran (its gate open) and the part has a value; mean: over
    those; passed: those at 0.5 or above (a 0/1 item's passes; for a judged item, answers the
    judge more likely said yes to); interval: 95% Wilson interval of passed / scored.
    """

    name: str
    reward: str
    scored: int
    mean: float
    passed: int
    interval: tuple[float, float]


@dataclass(frozen=True)
class CompletionStats:
    """Lengths in tokens; truncated = ended by max_completion_length, not EOS.

    entropy: mean of -log p over the sampled tokens, an estimate of the per-token entropy of the
    sampling distribution (nats). distinct_share: mean over groups of distinct texts / G.
    """

    mean_length: float
    min_length: int
    max_length: int
    truncated_share: float
    mean_terminated_length: float | None
    entropy: float | None
    distinct_share: float


@dataclass(frozen=True)
class PartialCredit:
    """How a partial-credit variant of a strict format reward would score the same completions."""

    reward: str
    """The strict reward it stands in for."""
    type: str
    tags: tuple[str, ...]
    mean: float
    zero_variance_share: float


@dataclass(frozen=True)
class ToolInfo:
    """What the verdict needs to know about the configured tools (``tools:``, or an
    environment's methods)."""

    names: tuple[str, ...]
    format: str | None
    """The format calls are read in (hermes, llama3, regex); None where it is not known."""
    lenient: bool
    """training.tool_call_lenient: calls written outside the format are run too."""
    chat_template: str | None = None
    """model.chat_template as configured (None: the model's own)."""
    replaced_tool_template: bool = False
    """model.chat_template replaced a template of the model's own that shows tools."""


@dataclass(frozen=True)
class ToolStats:
    """How the sampled completions used the tools.

    calling: completions with at least one call run (read in the format, or leniently); calls,
    failed: the calls run and those that failed. unparsed: completions that wrote a call of a
    known tool outside the format (bare JSON, a json code block); unparsed_calls: those calls.
    They were run only when ``info.lenient``.
    """

    info: ToolInfo
    completions: int
    calling: int
    calls: int
    failed: int
    unparsed: int
    unparsed_calls: int

    @property
    def call_rate(self) -> float:
        return self.calling / self.completions if self.completions else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        """95% Wilson interval of the share of completions that called a tool."""
        return wilson_interval(self.calling, self.completions)


@dataclass
class Measurement:
    """Everything one preflight measured; the verdict and the report read only this."""

    settings: DrawRecord
    infos: list[RewardInfo]
    rewards: list[RewardStats]
    total_mean: float
    total_zero_variance_share: float
    completions: CompletionStats
    partial_credit: list[PartialCredit] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)
    tools: ToolStats | None = None
    """With tools configured: how the completions called them."""
    parts: list[PartStats] = field(default_factory=list)
    """The rewards' parts (a checklist's items), each over the samples its reward scored."""

    def reward(self, name: str) -> RewardStats:
        for r in self.rewards:
            if r.name == name:
                return r
        raise KeyError(name)

    def info(self, name: str) -> RewardInfo:
        for i in self.infos:
            if i.name == name:
                return i
        raise KeyError(name)


def _groups(values: list[float | None], group_size: int) -> list[list[float | None]]:
    return [values[i : i + group_size] for i in range(0, len(values), group_size)]


def _as_optional(values: torch.Tensor) -> list[float | None]:
    return [None if math.isnan(v) else float(v) for v in values.tolist()]


def reward_table(
    scores: RewardScores,
    max_values: list[float | None],
    group_size: int,
    *,
    beta: float,
    std_normalized: bool,
) -> list[RewardStats]:
    """Per-reward statistics of B = P x G scored samples (group-major rows)."""
    out = []
    batch = scores.per_function.shape[0]
    for j, summary in enumerate(summarize(scores, max_values)):
        column = scores.per_function[:, j]
        gated = scores.gated_out[:, j]
        returned_none = torch.isnan(column) & ~gated
        interval = None
        fc = None
        if summary.passed is not None:
            interval = wilson_interval(summary.passed, summary.applicable)
            rate = summary.pass_rate
            if rate is not None:
                fc = forecast(rate, interval, beta=beta, std_normalized=std_normalized)
        out.append(
            RewardStats(
                name=summary.name,
                samples=batch,
                applicable=summary.applicable,
                mean=summary.mean,
                passed=summary.passed,
                interval=interval,
                zero_variance_share=zero_variance_share(_groups(_as_optional(column), group_size)),
                none_share=float(returned_none.float().mean()) if batch else 0.0,
                gated_out_share=float(gated.float().mean()) if batch else 0.0,
                forecast=fc,
            )
        )
    return out


def part_table(scores: RewardScores) -> list[PartStats]:
    """Per-part statistics over the rows each part's reward scored (gate open, value present)."""
    out = []
    for name, column in scores.parts.items():
        reward = scores.part_of.get(name)
        scored = ~torch.isnan(column)
        if reward is not None:
            scored &= ~scores.gated_out[:, scores.names.index(reward)]
        values = column[scored].double()
        n = int(values.numel())
        passed = int((values >= 0.5).sum())
        out.append(
            PartStats(
                name=name,
                reward=reward or "",
                scored=n,
                mean=float(values.mean()) if n else math.nan,
                passed=passed,
                interval=wilson_interval(passed, n),
            )
        )
    return out


def completion_stats(batches: list[ScoredBatch]) -> CompletionStats:
    """Lengths, truncation, entropy estimate and within-group diversity of the completions."""
    lengths = [n for b in batches for n in b.rollout.completion_lengths]
    reasons = [r for b in batches for r in b.rollout.finish_reason]
    terminated = [n for n, r in zip(lengths, reasons, strict=True) if r == "eos"]
    token_logps = [lp for b in batches for lp in b.rollout.logprobs if lp.numel()]
    n_tokens = sum(int(lp.numel()) for lp in token_logps)
    entropy = (
        float(-sum(float(lp.double().sum()) for lp in token_logps) / n_tokens) if n_tokens else None
    )
    shares = []
    for b in batches:
        g = b.group_size
        for i in range(0, len(b.texts), g):
            group = [t.strip() for t in b.texts[i : i + g]]
            shares.append(len(set(group)) / len(group))
    return CompletionStats(
        mean_length=sum(lengths) / len(lengths),
        min_length=min(lengths),
        max_length=max(lengths),
        truncated_share=sum(r == "length" for r in reasons) / len(reasons),
        mean_terminated_length=sum(terminated) / len(terminated) if terminated else None,
        entropy=entropy,
        distinct_share=sum(shares) / len(shares),
    )


def partial_credit(
    texts: list[str], infos: list[RewardInfo], group_size: int
) -> list[PartialCredit]:
    """tags_present scored on the same completions, for each strict xml_format reward.

    This is what adding the partial-credit reward would give, measured rather than guessed.
    Skipped where a tags_present reward with the same tags is already configured.
    """
    have = {i.tags for i in infos if i.type == "tags_present"}
    out = []
    for info in infos:
        if info.type != "xml_format" or info.tags is None or info.tags in have:
            continue
        values: list[float | None] = [tags_present_score(t, info.tags) for t in texts]
        present = [v for v in values if v is not None]
        out.append(
            PartialCredit(
                reward=info.name,
                type="tags_present",
                tags=info.tags,
                mean=sum(present) / len(present),
                zero_variance_share=zero_variance_share(_groups(values, group_size)),
            )
        )
    return out


def tool_stats(batches: list[ScoredBatch], info: ToolInfo) -> ToolStats:
    """The tool use of multi-turn completions (their turns; a single-turn batch calls nothing)."""
    turns = [t for b in batches for t in (b.rollout.turns or [[] for _ in b.texts])]
    calls = [c for row in turns for t in row for c in t.calls]
    unparsed = [sum(t.unparsed for t in row) for row in turns]
    return ToolStats(
        info=info,
        completions=len(turns),
        calling=sum(any(t.calls for t in row) for row in turns),
        calls=len(calls),
        failed=sum(c.failed for c in calls),
        unparsed=sum(n > 0 for n in unparsed),
        unparsed_calls=sum(unparsed),
    )


def _examples(batches: list[ScoredBatch], limit: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in batches:
        for row in range(len(b.texts)):
            if len(out) >= limit:
                return out
            values = b.scores.per_function[row].tolist()
            out.append(
                {
                    "completion": b.texts[row],
                    "finish_reason": b.rollout.finish_reason[row],
                    "rewards": {
                        n: (None if math.isnan(v) else v)
                        for n, v in zip(b.scores.names, values, strict=True)
                    },
                }
            )
    return out


def measure(
    batches: list[ScoredBatch],
    infos: list[RewardInfo],
    settings: DrawRecord,
    *,
    tools: ToolInfo | None = None,
    n_examples: int = 4,
) -> Measurement:
    """The full preflight measurement of one or more scored batches (same group size);
    ``tools``: the configured tools, whose use is measured too."""
    if not batches:
        raise ValueError("measure needs at least one scored batch")
    g = settings.generations
    if any(b.group_size != g for b in batches):
        raise ValueError(f"every batch must have group size {g}")
    scores = merge_scores([b.scores for b in batches])
    texts = [t for b in batches for t in b.texts]
    total = _as_optional(scores.total)
    present = [v for v in total if v is not None]
    return Measurement(
        settings=settings,
        infos=list(infos),
        rewards=reward_table(
            scores,
            [i.max_value for i in infos],
            g,
            beta=settings.beta,
            std_normalized=std_normalized_for(settings.scale_rewards),
        ),
        total_mean=sum(present) / len(present) if present else math.nan,
        total_zero_variance_share=zero_variance_share(_groups(total, g)),
        completions=completion_stats(batches),
        partial_credit=partial_credit(texts, infos, g),
        examples=_examples(batches, n_examples),
        tools=tool_stats(batches, tools) if tools is not None else None,
        parts=part_table(scores),
    )
