"""Multi-turn rollouts with tools, token-in / token-out, over any rollout engine.

Turn 1 samples ``n`` completions per prompt. Each completion whose turn ended at EOS with tool
calls in it has its calls run; the tool messages' tokens are appended, and the next turn is
sampled from ``prompt + everything so far``: the previous input's ids, the ids the model sampled
and the tool messages' ids, never a re-rendering of the conversation. Re-rendering would let the
chat template or BPE merges change earlier tokens (a dropped newline, a stripped ``<think>``, a
merge across the turn boundary), and the log-probs would then belong to tokens the model never
sampled. Only the new tool messages go through the chat template: as the text that follows the
model's end-of-turn token in the template's rendering of ``[..., assistant, tool, ...]`` with the
generation prompt, tokenized alone (it starts right after a special token, where the template's
own tokenization also starts afresh).

A turn whose calls the format's parser does not read but which holds JSON calls of known tools
(bare, or in a json code block) has them counted (``Turn.unparsed``), and run only with
``lenient``: a silent miss would teach the model that calling does nothing.

A row stops at EOS without a call, when ``max_tool_calling_iterations`` rounds of calls have run,
or when the completion budget (``max_completion_length`` over all turns) is spent; a tool result
that would leave the model no room to answer is run but not appended (the row ends there, as a
truncated completion). Finished rows are never sampled again.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from grpokit.errors import UserError
from grpokit.rollout.base import (
    EngineCapabilities,
    FinishReason,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    ToolExchange,
    Turn,
)
from grpokit.rollout.environments import Environments
from grpokit.rollout.tool_calls import Parser, ToolCallFormat, parse_lenient
from grpokit.rollout.tools import Tool, ToolCall, ToolResult, ToolRunner

_PROBE_USER = {"role": "user", "content": "Hello"}


def template_text(tokenizer: Any) -> str:
    """The chat template's source (all of them, for a tokenizer with several named ones)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return str(template or "")


class ToolMessageTokens:
    """The token ids that follow a model turn ending in tool calls: the rest of the chat
    template's end of the assistant turn after the model's EOS token, the tool messages, and the
    generation prompt of the next assistant turn.

    Args:
        tokenizer: the policy's tokenizer, with the chat template prompts are rendered with.
        tools: the tools' JSON schemas (the template's ``tools`` argument).
        chat_template_kwargs: the template's extra variables, as prompts get them.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]],
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.kwargs = dict(chat_template_kwargs or {})

    def _render(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
        text: str = self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **self.kwargs,
        )
        return text

    def suffix_text(
        self, end_token: int, calls: Sequence[ToolCall], results: Sequence[ToolResult]
    ) -> str:
        """The text after the model's last token ``end_token`` (its EOS) up to the next turn."""
        assistant = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": c.name or r.name, "arguments": c.arguments or {}},
                }
                for c, r in zip(calls, results, strict=True)
            ],
        }
        before = self._render([_PROBE_USER, assistant], generation_prompt=False)
        tool_messages = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        after = self._render([_PROBE_USER, assistant, *tool_messages], generation_prompt=True)
        # The model's turn ended with its end-of-turn token: the suffix starts right after the
        # template's end of that assistant turn, which is the same (k-th) end-of-turn text in
        # both renderings. Counting rather than comparing prefixes lets a template render the
        # turn itself differently once a tool message follows (Qwen3 drops an empty <think>
        # block from earlier turns): those tokens are the model's and are never re-rendered.
        eos_text = self.tokenizer.decode([end_token])
        turns_ended = before.count(eos_text) if eos_text else 0
        if turns_ended == 0:  # a template that does not end turns with this token
            if not after.startswith(before):
                raise ValueError(
                    f"the chat template does not end the assistant's turn with {eos_text!r}, and "
                    "renders it differently once a tool message follows"
                )
            return after[len(before) :]
        cut = -len(eos_text)
        for _ in range(turns_ended):
            cut = after.find(eos_text, cut + len(eos_text))
            if cut < 0:
                raise ValueError(
                    "the chat template renders fewer turn ends once a tool message follows"
                )
        return after[cut + len(eos_text) :]

    def turn_text(self, message: Mapping[str, Any], end_token: int) -> str:
        """The text the model writes for the assistant ``message`` (its content and its
        ``tool_calls`` as the chat template writes them), up to its end-of-turn token
        ``end_token``, which is not included: what a demonstration of that turn trains on.

        Raises:
            ValueError: the template renders the turn without a generation prompt before it.
        """
        before = self._render([_PROBE_USER], generation_prompt=True)
        full = self._render([_PROBE_USER, dict(message)], generation_prompt=False)
        if not full.startswith(before):
            raise ValueError(
                "the chat template does not render an assistant turn after its generation prompt"
            )
        text = full[len(before) :]
        eos_text = self.tokenizer.decode([end_token])
        cut = text.find(eos_text) if eos_text else -1
        return text if cut < 0 else text[:cut]

    def suffix_ids(
        self, end_token: int, calls: Sequence[ToolCall], results: Sequence[ToolResult]
    ) -> list[int]:
        ids: list[int] = self.tokenizer(
            self.suffix_text(end_token, calls, results), add_special_tokens=False
        )["input_ids"]
        return ids


def check_tool_template(
    tokenizer: Any,
    tools: list[dict[str, Any]],
    chat_template_kwargs: Mapping[str, Any] | None,
    *,
    end_token: int,
    where: str,
) -> None:
    """Refuse a chat template that cannot run tools: one that does not show the tools to the model
    (renders the same with and without ``tools``), or cannot render a tool message after an
    assistant turn without changing that turn.

    Raises:
        UserError: naming ``where`` (the template's setting) and what to do.
    """
    kwargs = dict(chat_template_kwargs or {})
    fix = (
        f"set {where} to a chat template with tool support (one that renders `tools` and "
        "'tool' messages, such as Qwen2.5's or Llama 3.1's), or to 'auto' for grpokit's "
        "ChatML one with <tool_call> tags on a ChatML model"
    )
    try:
        plain = tokenizer.apply_chat_template(
            [_PROBE_USER], tokenize=False, add_generation_prompt=True, **kwargs
        )
        with_tools = tokenizer.apply_chat_template(
            [_PROBE_USER], tools=tools, tokenize=False, add_generation_prompt=True, **kwargs
        )
    except Exception as exc:  # a template's own error (jinja raise_exception, bad variables)
        raise UserError(f"{where}: the chat template failed to render the tools: {exc}") from None
    if plain == with_tools:
        raise UserError(f"{where}: the chat template does not show `tools` to the model; {fix}")
    probe = ToolCall(str(tools[0]["function"]["name"]), {})
    result = ToolResult(probe.name or "", "tool-result-7f3a", failed=False)
    try:
        suffix = ToolMessageTokens(tokenizer, tools, kwargs).suffix_text(
            end_token, [probe], [result]
        )
    except Exception as exc:
        raise UserError(
            f"{where}: cannot append tool results with this template ({exc}); {fix}"
        ) from None
    if result.content not in suffix:
        raise UserError(f"{where}: the chat template does not render 'tool' messages; {fix}")


@dataclass
class _Row:
    """A completion being built over several turns."""

    context: list[int]  # the prompt's ids
    ids: list[int]
    mask: list[int]
    logps: list[float]
    finish: FinishReason
    turns: list[Turn] = field(default_factory=list)

    def add_turn(self, ids: list[int], logps: list[float], finish: FinishReason) -> None:
        start = len(self.ids)
        self.ids += ids
        self.mask += [1] * len(ids)
        self.logps += logps
        self.finish = finish
        self.turns.append(Turn(start, len(self.ids), len(self.ids)))


@dataclass
class ToolRollout:
    """Samples multi-turn completions in which the model calls tools (see the module's doc).

    Args:
        runner: runs the calls.
        parser: reads a turn's calls from its text.
        messages: the tool messages' tokens.
        max_iterations: rounds of tool calls at most (TRL's max_tool_calling_iterations); None
            for no limit but the completion budget.
    """

    runner: ToolRunner
    parser: Parser
    messages: ToolMessageTokens
    max_iterations: int | None = None
    environments: Environments | None = None
    """With an environment_factory: its instances, one per rollout, whose methods are tools."""
    lenient: bool = False
    """Also run the calls of known tools written outside the format (:func:`parse_lenient`) in a
    turn where the parser finds none; counted in ``Turn.unparsed`` either way."""
    format: ToolCallFormat | None = None
    """The format ``parser`` reads, for messages and advice; None where it is not known."""

    @property
    def names(self) -> list[str]:
        extra = [t.name for t in self.environments.tools] if self.environments else []
        return [*self.runner.tools, *extra]

    @property
    def schemas(self) -> list[dict[str, Any]]:
        extra = [t.schema for t in self.environments.tools] if self.environments else []
        return [*self.runner.schemas, *extra]

    def generate(
        self,
        engine: RolloutEngine,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
        environments: Sequence[Any] | None = None,
    ) -> RolloutBatch:
        """``n`` multi-turn completions per prompt, group-major, with ``tool_mask`` and ``turns``.

        environments: one environment instance per rollout (B), whose methods its calls use.
        """
        budget = params.max_completion_length
        contexts = [p for p in prompt_ids for _ in range(n)]
        first = engine.generate(prompt_ids, n, params, generator=generator)
        tools: list[Mapping[str, Tool]] | None = None
        if environments is not None and self.environments is not None:
            tools = [self.runner.tools | self.environments.tools_of(e) for e in environments]
        rows = []
        for b in range(len(first)):
            row = _Row(contexts[b], [], [], [], first.finish_reason[b])
            row.add_turn(first.completion_ids[b], first.logprobs[b].tolist(), row.finish)
            rows.append(row)
        active = list(range(len(rows)))
        # Each round adds at least one token, so the budget ends the loop if nothing else does.
        for iteration in itertools.count():
            # Read before the limit is checked, so that the last turn's unparsed calls count too.
            calling = [(b, calls) for b in active if (calls := self._calls(rows[b]))]
            if not calling or (
                self.max_iterations is not None and iteration >= self.max_iterations
            ):
                break
            results = self.runner.run(
                [calls for _, calls in calling],
                None if tools is None else [tools[b] for b, _ in calling],
            )
            active = []
            for (b, calls), mine in zip(calling, results, strict=True):
                if self._append_results(rows[b], calls, mine, budget):
                    active.append(b)
            if not active:
                break
            self._next_turn(engine, [rows[b] for b in active], params, generator)
        return RolloutBatch(
            prompt_ids=[list(p) for p in prompt_ids],
            completion_ids=[r.ids for r in rows],
            logprobs=[torch.tensor(r.logps, dtype=torch.float32) for r in rows],
            finish_reason=[r.finish for r in rows],
            group_size=n,
            tool_mask=[r.mask for r in rows],
            turns=[r.turns for r in rows],
        )

    def _calls(self, row: _Row) -> list[ToolCall]:
        """The calls of the row's last turn, if it ended at EOS (a cut turn's calls are cut too).
        Calls written outside the format are counted on the turn, and returned when lenient."""
        if row.finish != "eos":
            return []
        turn = row.turns[-1]
        text = self.messages.tokenizer.decode(
            row.ids[turn.start : turn.end], skip_special_tokens=True
        )
        calls = self.parser(text)
        if calls:
            return calls
        outside = parse_lenient(text, self.names)
        if outside:
            row.turns[-1] = replace(turn, unparsed=len(outside))
        return outside if self.lenient else []

    def _append_results(
        self, row: _Row, calls: list[ToolCall], results: list[ToolResult], budget: int
    ) -> bool:
        """Append the tool messages' tokens, unless they leave the model no room in the budget
        (then the row ends, truncated). Whether the row goes on."""
        turn = row.turns[-1]
        exchanges = tuple(
            ToolExchange(r.name, c.arguments, r.content, r.failed)
            for c, r in zip(calls, results, strict=True)
        )
        suffix = self.messages.suffix_ids(row.ids[-1], calls, results)
        if len(row.ids) + len(suffix) >= budget:
            row.turns[-1] = replace(turn, calls=exchanges)
            row.finish = "length"
            return False
        row.ids += suffix
        row.mask += [0] * len(suffix)
        row.logps += [0.0] * len(suffix)
        row.turns[-1] = replace(turn, calls=exchanges, tool_end=len(row.ids))
        return True

    def _next_turn(
        self,
        engine: RolloutEngine,
        rows: list[_Row],
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> None:
        """One more turn for each row, within what is left of its budget."""
        budget = params.max_completion_length
        left = [budget - len(r.ids) for r in rows]
        out = engine.generate(
            [r.context + r.ids for r in rows],
            1,
            replace(params, max_completion_length=max(left)),
            generator=generator,
        )
        for i, row in enumerate(rows):
            ids, logps = out.completion_ids[i], out.logprobs[i].tolist()
            finish = out.finish_reason[i] if len(ids) <= left[i] else "length"
            row.add_turn(ids[: left[i]], logps[: left[i]], finish)


class ToolEngine(RolloutEngine):
    """An engine whose completions may call tools: ``inner`` samples every turn, ``tools`` reads
    the calls, runs them and appends their results (:meth:`ToolRollout.generate`).

    It declares none of the capabilities, whatever ``inner`` offers: reference log-probs scored
    while sampling would cover the first turn only; generating ahead needs each next prompt
    now, and a turn's prompt holds the results of the last turn's calls.
    """

    capabilities = EngineCapabilities()

    def __init__(
        self,
        inner: RolloutEngine,
        tools: ToolRollout,
        environments: Sequence[Any] | None = None,
    ) -> None:
        self.inner = inner
        self.tools: ToolRollout = tools
        self.environments = environments
        """Bound by :meth:`with_environments`: one instance per completion row (B)."""

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        if self.tools.environments is not None and self.environments is None:
            raise ValueError(
                "an environment's tools need their instances: generate through "
                "with_environments(the batch's reset instances)"
            )
        return self.tools.generate(
            self.inner, prompt_ids, n, params, generator=generator, environments=self.environments
        )

    def with_environments(self, environments: Sequence[Any]) -> ToolEngine:
        return ToolEngine(self.inner, self.tools, list(environments))

    def sync_weights(self) -> None:
        self.inner.sync_weights()

    def close(self) -> None:
        self.inner.close()


def with_tools(engine: RolloutEngine, tools: ToolRollout | None) -> RolloutEngine:
    """``engine`` whose completions may call ``tools`` (itself without any)."""
    return engine if tools is None else ToolEngine(engine, tools)


def transcript(
    tokenizer: Any, completion_ids: list[int], turns: list[Turn]
) -> list[dict[str, Any]]:
    """A multi-turn completion as chat messages: each model turn (with the calls it made) and
    each tool message appended after it (``error`` marks a failed call)."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        text = tokenizer.decode(completion_ids[turn.start : turn.end], skip_special_tokens=True)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if turn.calls:
            message["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in turn.calls]
        messages.append(message)
        if turn.tool_end > turn.end:
            messages += [
                {"role": "tool", "name": c.name, "content": c.content, "error": c.failed}
                for c in turn.calls
            ]
    return messages
