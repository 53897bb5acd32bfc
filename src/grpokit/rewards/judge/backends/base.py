"""What every judge backend returns, and the interface the judge reward calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from grpokit.rewards.judge.expected import TokenLogprob


@dataclass(frozen=True)
class JudgeReply:
    """One judge answer: its text and, when available, per-token logprobs; or an error.

    Exactly one of ``text`` and ``error`` is set. ``error`` is a transport problem (timeout,
    refused connection, HTTP error after all retries): it is not cached and counts as a request
    failure, distinct from a reply that came back but held no score (a parse failure).
    """

    text: str | None
    tokens: tuple[TokenLogprob, ...] | None = None
    error: str | None = None
    usage: tuple[int, int] | None = None
    """(input tokens, output tokens) the server counted for this request (its ``usage``), when
    it says."""
    cached_tokens: int = 0
    """Of the input tokens, those the server answered from its prompt cache
    (``usage.prompt_tokens_details.cached_tokens``: OpenAI's, llama.cpp's server), when it says."""

    @staticmethod
    def failed(error: str) -> JudgeReply:
        """A reply for a request that failed."""
        return JudgeReply(text=None, tokens=None, error=error)


class JudgeBackend(Protocol):
    """A model that answers judge prompts."""

    @property
    def identity(self) -> str:
        """Everything that changes its answers (backend, endpoint, model, sampling), for the
        cache key."""
        ...

    @property
    def description(self) -> str:
        """A short human-readable name for tables and logs."""
        ...

    def complete(self, prompts: Sequence[str], *, logprobs: bool) -> list[JudgeReply]:
        """Answer each prompt (a user message); one reply per prompt, in order.

        Never raises for a failed request: the reply carries the error instead.
        """
        ...

    def close(self) -> None:
        """Release connections, threads and models."""
        ...
