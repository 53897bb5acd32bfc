"""Multi-turn completions (transcripts) for reading: each model turn, the tool calls it made and
the tool messages that answered them, with the calls and results marked so that a reader never
takes a tool's output for the model's.

A transcript is the list of chat messages :func:`grpokit.rollout.agent.transcript` makes and
``completions.jsonl`` stores: ``{"role": "assistant", "content": ..., "tool_calls": [{"name",
"arguments"}]}`` for a model turn and ``{"role": "tool", "name", "content", "error"}`` for a tool
message. Three views of it: marked plain text (Markdown files, logs), Rich markup (the terminal)
and HTML (the report). Every text in it came from the model or a tool, so each view escapes it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from grpokit.evaluate.html import esc
from grpokit.rewards.text import completion_text

Kind = Literal["model", "call", "result", "error"]

LABELS: dict[Kind, str] = {
    "model": "model",
    "call": "tool call",
    "result": "tool result",
    "error": "tool error",
}
MARKS: dict[Kind, str] = {"model": "", "call": ">>", "result": "<<", "error": "!!"}
"""The plain-text marker of each kind (ASCII, so any terminal and any Markdown renderer keep it)."""
STYLES: dict[Kind, str] = {
    "model": "",
    "call": "bold magenta",
    "result": "bold green",
    "error": "bold red",
}


@dataclass(frozen=True)
class Part:
    """One block of a transcript: what made it (``kind``), a label naming the tool, the text."""

    kind: Kind
    label: str
    text: str


def is_transcript(value: Any) -> bool:
    """Whether ``value`` reads as a transcript (a list of messages with roles)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    )


def call_text(call: Any) -> str:
    """A tool call as ``name({"arg": value})``."""
    if not isinstance(call, dict):
        return str(call)
    arguments = call.get("arguments")
    shown = "" if arguments is None else json.dumps(arguments, ensure_ascii=False)
    return f"{call.get('name') or '?'}({shown})"


def parts(messages: Sequence[dict[str, Any]]) -> list[Part]:
    """The blocks of a transcript in order: each model turn's text, then one block per call it
    made; each tool message as a result (or an error, for a failed call)."""
    out: list[Part] = []
    for message in messages:
        if message.get("role") == "tool":
            kind: Kind = "error" if message.get("error") else "result"
            name = message.get("name") or "?"
            out.append(Part(kind, f"{LABELS[kind]} · {name}", str(message.get("content") or "")))
            continue
        out.append(Part("model", str(message.get("role") or "model"), completion_text(message)))
        for call in message.get("tool_calls") or []:
            out.append(Part("call", LABELS["call"], call_text(call)))
    return out


def _cut(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}… [{len(text) - max_chars} more characters]"


def to_text(messages: Sequence[dict[str, Any]], *, max_chars: int | None = None) -> str:
    """The transcript as marked plain text: model turns as they are, and each tool block on
    lines of its own, starting ``>> tool call:``, ``<< tool result · name:`` or ``!! tool error ·
    name:``. ``max_chars`` cuts each block's text."""
    lines = []
    for part in parts(messages):
        text = _cut(part.text, max_chars)
        if part.kind == "model":
            lines.append(text)
        else:
            lines.append(f"{MARKS[part.kind]} {part.label}: {text}")
    return "\n".join(lines)


def to_markdown(messages: Sequence[dict[str, Any]], *, max_chars: int | None = None) -> str:
    """The marked plain text as a Markdown block: indented four spaces, so nothing in it (HTML,
    backticks, emphasis) is rendered."""
    return "\n".join(f"    {line}" for line in to_text(messages, max_chars=max_chars).splitlines())


def to_rich(messages: Sequence[dict[str, Any]], *, max_chars: int | None = None) -> str:
    """The transcript as Rich console markup: the text escaped, each tool block behind a coloured
    marker (the same markers as :func:`to_text`, so it reads without colour too)."""
    from rich.markup import escape

    lines = []
    for part in parts(messages):
        text = escape(_cut(part.text, max_chars))
        if part.kind == "model":
            lines.append(text)
        else:
            marker = escape(f"{MARKS[part.kind]} {part.label}:")
            lines.append(f"[{STYLES[part.kind]}]{marker}[/] {text}")
    return "\n".join(lines)


CLASSES: dict[Kind, str] = {
    "model": "turn",
    "call": "tool-call",
    "result": "tool-result",
    "error": "tool-error",
}


def to_html(messages: Sequence[dict[str, Any]], *, max_chars: int | None = None) -> str:
    """The transcript as HTML: one block per part, classed ``turn``, ``tool-call``,
    ``tool-result`` or ``tool-error`` (each styled apart), every text escaped."""
    blocks = []
    for part in parts(messages):
        blocks.append(
            f'<div class="msg {CLASSES[part.kind]}"><div class="who">{esc(part.label)}</div>'
            f"<pre>{esc(_cut(part.text, max_chars))}</pre></div>"
        )
    return f'<div class="transcript">{"".join(blocks)}</div>'
