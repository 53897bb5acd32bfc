"""Sample G completions per prompt and score them: the first half of a GRPO step.

The trainer, periodic held-out checks, preflight, eval, generate and the demo all call
`sample_and_score`, so what is measured before and after training is exactly what training
optimises.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from grpokit.data.chat import encode_prompt
from grpokit.data.prompts import PromptRow, columns_of
from grpokit.rewards.compose import RewardScores, RewardSet
from grpokit.rollout.agent import transcript
from grpokit.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from grpokit.rollout.environments import with_observation


@dataclass(frozen=True)
class Sample:
    """One scored completion, as the eval and generate tables list them."""

    model: str
    prompt_index: int
    sample: int
    text: str
    total: float | None
    rewards: dict[str, float | None]
    length: int
    truncated: bool
    transcript: list[dict[str, Any]] | None = None
    """With tools: the turns, tool calls and tool results as chat messages."""
    parts: dict[str, float | None] = field(default_factory=dict)
    """Sub-scores of rewards that report them (a checklist's items, ``checklist/<item>``)."""


@dataclass
class ScoredBatch:
    """P prompts x G completions, group-major, with their rewards.

    rows: P prompt rows; texts: B = P * G decoded completions; scores.total: (B,).
    messages: with tools, each completion's turns as chat messages (assistant turns with their
    tool calls, tool messages with their results); None without.
    row_prompt_ids: each completion's own prompt (B) where an environment's reset made a group's
    prompts differ (prompt_ids then holds each group's first); None otherwise.
    """

    rows: list[PromptRow]
    prompt_ids: list[list[int]]
    rollout: RolloutBatch
    texts: list[str]
    scores: RewardScores
    generate_seconds: float = 0.0
    score_seconds: float = 0.0
    messages: list[list[dict[str, Any]]] | None = None
    row_prompt_ids: list[list[int]] | None = None

    @property
    def group_size(self) -> int:
        return self.rollout.group_size

    def expanded_prompt_ids(self) -> list[list[int]]:
        """The prompt ids of each completion (B lists)."""
        if self.row_prompt_ids is not None:
            return self.row_prompt_ids
        return [p for p in self.prompt_ids for _ in range(self.group_size)]

    def samples(self, model: str, *, first_prompt: int = 0) -> list[Sample]:
        """Each completion as a :class:`Sample`; prompts are numbered from ``first_prompt``."""
        g = self.group_size
        per_fn = self.scores.per_function
        out = []
        for b, text in enumerate(self.texts):
            total = float(self.scores.total[b])
            out.append(
                Sample(
                    model=model,
                    prompt_index=first_prompt + b // g,
                    sample=b % g,
                    text=text,
                    total=None if math.isnan(total) else total,
                    rewards={
                        name: None if math.isnan(v := float(per_fn[b, j])) else v
                        for j, name in enumerate(self.scores.names)
                    },
                    length=len(self.rollout.completion_ids[b]),
                    truncated=self.rollout.finish_reason[b] == "length",
                    transcript=None if self.messages is None else self.messages[b],
                    parts={
                        name: None if math.isnan(v := float(column[b])) else v
                        for name, column in self.scores.parts.items()
                    },
                )
            )
        return out


def reward_inputs(
    rows: list[PromptRow],
    texts: list[str],
    completion_ids: list[list[int]],
    group_size: int,
    messages: list[list[dict[str, Any]]] | None = None,
) -> tuple[list[Any], list[Any], dict[str, list[Any]]]:
    """prompts, completions and columns as TRL passes them to reward functions.

    Completions are strings for string prompts and assistant-message lists for chat prompts (with
    tools, ``messages``: the turns and tool messages, as TRL passes them);
    `completion_ids` (the sampled token ids) is passed as a column, as TRL does.
    """
    expanded = [r for r in rows for _ in range(group_size)]
    prompts = [r.prompt for r in expanded]
    completions: list[Any] = [
        t
        if isinstance(r.prompt, str)
        else (messages[b] if messages is not None else [{"role": "assistant", "content": t}])
        for b, (r, t) in enumerate(zip(expanded, texts, strict=True))
    ]
    return prompts, completions, {**columns_of(expanded), "completion_ids": completion_ids}


def sample_and_score(
    engine: RolloutEngine,
    tokenizer: Any,
    rows: list[PromptRow],
    reward_set: RewardSet,
    *,
    num_generations: int,
    sampling: SamplingParams,
    system_prompt: str | None,
    max_prompt_length: int | None,
    generator: torch.Generator | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> ScoredBatch:
    """``num_generations`` completions of each row's prompt, decoded and scored by the set.

    With an engine that runs tools (``engine.tools``), the prompts show them and completions
    span several turns; with an environment, one instance per rollout is reset with its row,
    bound to the engine for this batch and passed to the rewards as ``environments``.
    """
    g = num_generations
    tools = engine.tools
    schemas = tools.schemas if tools is not None else None

    def encode(prompt: Any) -> list[int]:
        return encode_prompt(
            tokenizer,
            prompt,
            system_prompt=system_prompt,
            max_prompt_length=max_prompt_length,
            chat_template_kwargs=chat_template_kwargs,
            tools=schemas,
        )

    environments = None
    row_prompt_ids = None
    if tools is not None and tools.environments is not None:
        environments = tools.environments.take(len(rows) * g)
        expanded = [r for r in rows for _ in range(g)]
        per_row = [
            encode(with_observation(r.prompt, env.reset(**{"prompt": r.prompt, **r.columns})))
            for r, env in zip(expanded, environments, strict=True)
        ]
        prompt_ids = per_row[::g]
        if any(ids != prompt_ids[b // g] for b, ids in enumerate(per_row)):
            row_prompt_ids = per_row  # resets that differ within a group: a prompt per rollout
        engine = engine.with_environments(environments)
    else:
        prompt_ids = [encode(r.prompt) for r in rows]
    t0 = time.perf_counter()
    if row_prompt_ids is None:
        rollout = engine.generate(prompt_ids, g, sampling, generator=generator)
    else:  # one completion of each rollout's own prompt, labelled with its group's first
        own = engine.generate(row_prompt_ids, 1, sampling, generator=generator)
        rollout = replace(own, prompt_ids=[list(p) for p in prompt_ids], group_size=g)
    t1 = time.perf_counter()
    texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    messages = None
    if rollout.turns is not None:
        messages = [
            transcript(tokenizer, ids, turns)
            for ids, turns in zip(rollout.completion_ids, rollout.turns, strict=True)
        ]
    prompts, completions, columns = reward_inputs(rows, texts, rollout.completion_ids, g, messages)
    scores = reward_set(prompts, completions, columns, environments=environments)
    seconds = time.perf_counter() - t1
    return ScoredBatch(
        rows, prompt_ids, rollout, texts, scores, t1 - t0, seconds, messages, row_prompt_ids
    )


def merge_scores(parts: list[RewardScores]) -> RewardScores:
    """One RewardScores from batches scored separately (rows concatenated in order).

    ``metrics`` of the merge is empty: they are per-batch quantities, recomputed where needed.
    """
    if not parts:
        raise ValueError("merge_scores needs at least one batch")
    return RewardScores(
        names=list(parts[0].names),
        per_function=torch.cat([p.per_function for p in parts]),
        gated_out=torch.cat([p.gated_out for p in parts]),
        total=torch.cat([p.total for p in parts]),
        metrics={},
        parts={name: torch.cat([p.parts[name] for p in parts]) for name in parts[0].parts},
        part_of=dict(parts[0].part_of),
    )


@dataclass(frozen=True)
class PassSummary:
    """One reward over a set of samples: mean of the applicable ones, and passes at its max."""

    name: str
    mean: float
    applicable: int
    passed: int | None  # None for rewards without a maximum

    @property
    def pass_rate(self) -> float | None:
        if self.passed is None or not self.applicable:
            return None
        return self.passed / self.applicable


def summarize(scores: RewardScores, max_values: list[float | None]) -> list[PassSummary]:
    """Per-reward mean and pass count (share at the reward's maximum), ignoring None values."""
    out = []
    for j, (name, top) in enumerate(zip(scores.names, max_values, strict=True)):
        col = scores.per_function[:, j]
        col = col[~torch.isnan(col)]
        mean = float(col.mean()) if len(col) else float("nan")
        passed = int((col >= top - 1e-9).sum()) if top is not None else None
        out.append(PassSummary(name, mean, len(col), passed))
    return out
