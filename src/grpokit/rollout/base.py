"""The interface every generation engine implements, and the records it returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from grpokit.rollout.agent import ToolRollout

FinishReason = Literal["eos", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled (TRL / vLLM names).

    ``temperature`` 0 means greedy decoding; its log-probs are then those of the untempered
    distribution (T = 1), since a zero temperature has no distribution to score under.
    ``top_k`` 0, ``top_p`` 1.0, ``min_p`` 0 and ``repetition_penalty`` 1.0 turn those off.
    The reported log-probs are the model's, before the penalty and the filters.
    ``ignore_eos`` (vLLM's name) samples ``max_completion_length`` tokens whatever comes: for
    benchmarks that compare engines at one length, where completions that end at different
    points would make tokens per second a measure of where they ended.
    """

    max_completion_length: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_completion_length < 1:
            raise ValueError(
                f"max_completion_length must be >= 1, got {self.max_completion_length}"
            )
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(
                f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}"
            )

    @property
    def greedy(self) -> bool:
        """Whether decoding is deterministic argmax (temperature 0 or top_k 1)."""
        return self.temperature == 0 or self.top_k == 1


@dataclass(frozen=True)
class ToolExchange:
    """One tool call a model turn made, and what it gave back (``content`` is the tool message's
    text; ``{"error": ...}`` when ``failed``)."""

    name: str
    arguments: dict[str, Any] | None
    content: str
    failed: bool


@dataclass(frozen=True)
class Turn:
    """One model turn of a multi-turn completion and the tool messages after it.

    Completion tokens ``[start, end)`` were sampled by the model; ``[end, tool_end)`` are the
    tool messages' tokens (with the chat template's markup around them), empty when no result was
    appended. ``calls``: the calls the turn made that were run, with their results (a result
    that would have overflowed the completion budget was run but not appended). ``unparsed``:
    calls of known tools the turn wrote outside the tool-call format (JSON its parser does not
    read; grpokit.rollout.tool_calls.parse_lenient), counted whether or not lenient parsing ran
    them (then they are in ``calls`` too).
    """

    start: int
    end: int
    tool_end: int
    calls: tuple[ToolExchange, ...] = ()
    unparsed: int = 0


@dataclass
class RolloutBatch:
    """Completions for P prompts, ``group_size`` (n) each, B = P * n in all.

    Rows are group-major: completions ``i * n .. i * n + n - 1`` belong to prompt ``i``.
    ``completion_ids[b]`` includes the EOS token when ``finish_reason[b] == "eos"``.
    ``logprobs[b]`` (shape ``(len(completion_ids[b]),)``, float32, CPU) holds the log-probability of
    each sampled token under the distribution it was drawn from: ``softmax(logits / T)``, truncated
    by top-k / top-p and renormalised over the kept tokens where they truncate (vLLM's
    ``processed_logprobs``; grpokit.core.truncation gives the kept set), before any repetition
    penalty or min-p: the quantity the trainer recomputes (training.truncated_logprobs).

    With tools (grpokit.rollout.agent), a completion spans several turns: ``tool_mask[b]``
    (same length as ``completion_ids[b]``) is 1 at tokens the model sampled and 0 at tool
    messages' tokens, whose ``logprobs`` are 0; ``turns[b]`` lays the turns out. Both are None for
    single-turn rollouts.

    ``weight_version``: how many weight syncs the engine had applied when it generated the batch,
    from an engine that generates ahead of training (grpokit.rollout.ahead); None otherwise.

    ``ref_logprobs[b]`` (like ``logprobs[b]``): the reference model's log-probabilities of the
    same tokens under its ``softmax(logits / T)``, never truncated (they serve the KL), from an
    engine that scores them while it
    generates (grpokit.rollout.torch_engine, a LoRA policy's base); None where the trainer
    computes them.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[torch.Tensor]
    finish_reason: list[FinishReason]
    group_size: int
    tool_mask: list[list[int]] | None = None
    turns: list[list[Turn]] | None = field(default=None, repr=False)
    weight_version: int | None = None
    ref_logprobs: list[torch.Tensor] | None = None

    def __post_init__(self) -> None:
        expected = len(self.prompt_ids) * self.group_size
        sizes = {len(self.completion_ids), len(self.logprobs), len(self.finish_reason)}
        if sizes != {expected}:
            raise ValueError(
                f"RolloutBatch: {len(self.prompt_ids)} prompts x group_size {self.group_size} "
                f"needs {expected} rows, got completion_ids/logprobs/finish_reason lengths "
                f"{len(self.completion_ids)}/{len(self.logprobs)}/{len(self.finish_reason)}"
            )
        if self.ref_logprobs is not None and len(self.ref_logprobs) != expected:
            raise ValueError(
                f"RolloutBatch: {expected} rows, got {len(self.ref_logprobs)} ref_logprobs"
            )

    def __len__(self) -> int:
        return len(self.completion_ids)

    def prompt_index(self, row: int) -> int:
        """The prompt a completion row belongs to."""
        return row // self.group_size

    @property
    def completion_lengths(self) -> list[int]:
        return [len(ids) for ids in self.completion_ids]


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine offers beyond ``generate``, ``sync_weights`` and ``close``. Callers read
    this record, never the engine's type, so a wrapper (an engine generating ahead, one whose
    weights are gathered first) offers what it declares and nothing is probed."""

    reference_logprobs: bool = False
    """``generate`` can also score the sampled tokens under the reference model
    (:attr:`RolloutBatch.ref_logprobs`) while :attr:`RolloutEngine.reference_logprobs` is on."""
    weight_version: bool = False
    """The engine samples from weights older than the trainer's: it stamps each batch's
    :attr:`RolloutBatch.weight_version` and counts the pushes asked for in
    :attr:`RolloutEngine.weight_version`."""
    prefetch: bool = False
    """:meth:`RolloutEngine.prefetch` queues a generation that a later ``generate`` of the same
    arguments returns."""


class RolloutEngine(ABC):
    """Samples ``n`` completions for each prompt (token ids in, token ids out).

    ``sync_weights`` is called after every optimizer step: an engine that holds its own copy of
    the weights (vLLM) takes the policy's new ones; an engine that reads the policy's own
    modules has nothing to do. ``close`` is called once when training ends (an engine generating
    ahead has a thread to stop). What else an engine offers it declares in ``capabilities``;
    an engine whose completions call tools (:class:`grpokit.rollout.agent.ToolEngine`) declares
    them in ``tools``.
    """

    capabilities: EngineCapabilities = EngineCapabilities()
    reference_logprobs: bool = False
    """Whether ``generate`` scores the reference log-probs now (only where ``capabilities``
    says it can); :func:`without_reference_logprobs` turns it off for a block."""
    weight_version: int | None = None
    """Weight pushes asked for so far (the trainer's weight version), where
    ``capabilities.weight_version``; None elsewhere."""
    tools: ToolRollout | None = None
    """The tools (and environment) the model may call in this engine's completions, which then
    span several turns; None for single-turn completions. Prompts must show these tools."""

    @abstractmethod
    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch: ...

    @abstractmethod
    def sync_weights(self) -> None: ...

    def close(self) -> None:  # noqa: B027 (deliberately empty: most engines hold nothing)
        """Release what the engine holds beyond the process's memory (threads, servers)."""

    def prefetch(self, prompt_ids: list[list[int]], n: int, params: SamplingParams) -> None:
        """Queue a generation (where ``capabilities.prefetch``)."""
        raise NotImplementedError(f"{type(self).__name__} does not generate ahead")

    def with_environments(self, environments: Sequence[Any]) -> RolloutEngine:
        """This engine for one batch whose completion ``b`` calls the methods of
        ``environments[b]`` (where ``tools`` has an environment; their reset needs the prompt
        rows, which ``generate`` does not get, so the sampler resets them and binds them here)."""
        raise NotImplementedError(f"{type(self).__name__} runs no tools, so no environments")


@contextmanager
def without_reference_logprobs(engine: RolloutEngine) -> Iterator[None]:
    """Generate without reference rows inside the block (a held-out check needs no reference
    log-probs, and they would double an engine's decoding rows); restored after."""
    was = engine.reference_logprobs
    engine.reference_logprobs = False
    try:
        yield
    finally:
        engine.reference_logprobs = was


def check_generate_args(prompt_ids: list[list[int]], n: int) -> None:
    """What every engine's ``generate`` refuses: no completions asked for, no prompt, or an
    empty one (an engine would have no position to sample the first token from).

    Raises:
        ValueError: naming which.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not prompt_ids or any(len(ids) == 0 for ids in prompt_ids):
        raise ValueError("generate needs at least one prompt, and no prompt may be empty")
