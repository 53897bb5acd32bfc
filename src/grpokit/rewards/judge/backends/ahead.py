"""A backend wrapper that asks a batch of prompts ahead, in an order the caller chooses.

A checklist asks several questions about each completion ("Business proposal: {completion}
Question: ..."). Asked item by item, consecutive requests share only the template's first
tokens, and a server with one slot (llama.cpp's, as ``local_server`` starts it) reads every
completion again for every question: five questions cost five reads of a 300-token answer. Asked
completion by completion, each question after the first reuses the server's cached prefix and
costs only its own tokens (measured on the business-ideas recipe with Qwen2.5-Coder-1.5B:
docs/experiments.md). A remote API gains too: one ``complete`` call keeps ``max_concurrency``
requests in flight across all the items instead of item after item.

The wrapped backend's answers are not changed, only when they are asked: :meth:`ask_ahead`
sends the prompts in the given order and keeps the replies; :meth:`complete` answers kept
prompts from them and sends the rest; :meth:`forget` drops what is kept (the caller's batch is
done).
"""

from __future__ import annotations

from collections.abc import Sequence

from grpokit.rewards.judge.backends.base import JudgeBackend, JudgeReply


class AskAheadBackend:
    """``JudgeBackend`` around another, with replies asked ahead (see the module's docstring)."""

    def __init__(self, inner: JudgeBackend) -> None:
        self.inner = inner
        self._kept: dict[tuple[str, bool], JudgeReply] = {}

    @property
    def identity(self) -> str:
        return self.inner.identity

    @property
    def description(self) -> str:
        return self.inner.description

    def ask_ahead(self, prompts: Sequence[str], *, logprobs: bool) -> None:
        """Ask ``prompts`` now, in this order (repeats asked once), and keep the replies.

        Failed requests are not kept: a later :meth:`complete` asks them again, under the
        wrapped backend's own retries.
        """
        todo = [p for p in dict.fromkeys(prompts) if (p, logprobs) not in self._kept]
        if todo:
            for prompt, reply in zip(
                todo, self.inner.complete(todo, logprobs=logprobs), strict=True
            ):
                if reply.error is None:
                    self._kept[(prompt, logprobs)] = reply

    def complete(self, prompts: Sequence[str], *, logprobs: bool) -> list[JudgeReply]:
        # Read what is kept once: a batch scored at the same time may forget() it meanwhile.
        kept = {p: self._kept.get((p, logprobs)) for p in dict.fromkeys(prompts)}
        missing = [p for p, reply in kept.items() if reply is None]
        asked: dict[str, JudgeReply] = {}
        if missing:
            replies = self.inner.complete(missing, logprobs=logprobs)
            asked = dict(zip(missing, replies, strict=True))
        return [kept[p] or asked[p] for p in prompts]

    def forget(self) -> None:
        """Drop the kept replies."""
        self._kept.clear()

    def close(self) -> None:
        self._kept.clear()
        self.inner.close()
