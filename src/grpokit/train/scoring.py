"""Sample G completions per prompt and score them: the first half of a GRPO step.

The trainer, periodic held-out checks, preflight and eval all call `sample_and_score`, so what is
measured before training is exactly what training optimises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.data.chat import encode_prompt
from grpokit.data.prompts import PromptRow, columns_of
from grpokit.rewards.compose import RewardScores, RewardSet
from grpokit.rollout.base import RolloutBatch, RolloutEngine, SamplingParams


@dataclass
class ScoredBatch:
    """P prompts x G completions, group-major, with their rewards.

    rows: P prompt rows; texts: B = P * G decoded completions; scores.total: (B,).
    """

    rows: list[PromptRow]
    prompt_ids: list[list[int]]
    rollout: RolloutBatch
    texts: list[str]
    scores: RewardScores
    generate_seconds: float = 0.0
    score_seconds: float = 0.0

    @property
    def group_size(self) -> int:
        return self.rollout.group_size

    def expanded_prompt_ids(self) -> list[list[int]]:
        """The prompt ids of each completion (B lists)."""
        return [p for p in self.prompt_ids for _ in range(self.group_size)]


def reward_inputs(
    rows: list[PromptRow], texts: list[str], completion_ids: list[list[int]], group_size: int
) -> tuple[list[Any], list[Any], dict[str, list[Any]]]:
    """prompts, completions and columns as TRL passes them to reward functions.

    Completions are strings for string prompts and assistant-message lists for chat prompts;
    `completion_ids` (the sampled token ids) is passed as a column, as TRL does.
    """
    expanded = [r for r in rows for _ in range(group_size)]
    prompts = [r.prompt for r in expanded]
    completions: list[Any] = [
        t if isinstance(r.prompt, str) else [{"role": "assistant", "content": t}]
        for r, t in zip(expanded, texts, strict=True)
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
) -> ScoredBatch:
    prompt_ids = [
        encode_prompt(
            tokenizer, r.prompt, system_prompt=system_prompt, max_prompt_length=max_prompt_length
        )
        for r in rows
    ]
    t0 = time.perf_counter()
    rollout = engine.generate(prompt_ids, num_generations, sampling, generator=generator)
    t1 = time.perf_counter()
    texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    prompts, completions, columns = reward_inputs(
        rows, texts, rollout.completion_ids, num_generations
    )
    scores = reward_set(prompts, completions, columns)
    return ScoredBatch(rows, prompt_ids, rollout, texts, scores, t1 - t0, time.perf_counter() - t1)


@dataclass(frozen=True)
class RewardSummary:
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


def summarize(scores: RewardScores, max_values: list[float | None]) -> list[RewardSummary]:
    """Per-reward mean and pass count (share at the reward's maximum), ignoring None values."""
    out = []
    for j, (name, top) in enumerate(zip(scores.names, max_values, strict=True)):
        col = scores.per_function[:, j]
        col = col[~torch.isnan(col)]
        mean = float(col.mean()) if len(col) else float("nan")
        passed = int((col >= top - 1e-9).sum()) if top is not None else None
        out.append(RewardSummary(name, mean, len(col), passed))
    return out
