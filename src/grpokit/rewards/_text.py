"""Turning a completion (a string or chat messages) into the text that rewards score."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def completion_text(completion: Any) -> str:
    """The text of one completion, whatever shape TRL or grpokit hands it over in.

    Accepted: a string; a message dict (``{"role": ..., "content": ...}``, or ``{"text": ...}``);
    a list of message dicts (TRL's conversational completions), whose contents are joined with a
    newline; content given as a list of parts (``[{"type": "text", "text": ...}]``) is joined.
    ``None`` becomes the empty string.

    >>> completion_text([{"role": "assistant", "content": "hi"}])
    'hi'
    >>> completion_text({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    'ab'
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content")
        if content is None:
            content = completion.get("text")
        return _content_text(content)
    if isinstance(completion, Sequence):
        parts = [completion_text(message) for message in completion]
        return "\n".join(part for part in parts if part)
    return str(completion)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Multimodal content: keep only the text parts.
        texts: list[str] = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type", "text") == "text":
                    texts.append(str(part.get("text") or ""))
            else:
                texts.append(str(part))
        return "".join(texts)
    return str(content)


def one_line(text: str, max_chars: int) -> str:
    """``text`` on one line (runs of whitespace become one space), cut to ``max_chars`` with an
    ellipsis: for tables and messages that quote a completion or a judge's reply."""
    flat = " ".join(text.split())
    return flat if len(flat) <= max_chars else flat[: max_chars - 1] + "…"


def completion_texts(completions: Sequence[Any]) -> list[str]:
    """:func:`completion_text` over a batch."""
    return [completion_text(c) for c in completions]


def column_value(columns: dict[str, Any], name: str, index: int, reward: str) -> Any:
    """Row ``index`` of column ``name``; a clear error naming the reward when it is absent."""
    from grpokit.errors import UserError

    if name not in columns or columns[name] is None:
        available = ", ".join(sorted(k for k in columns if not k.startswith("_"))) or "none"
        raise UserError(
            f"reward {reward!r} needs the dataset column {name!r}, but the batch has only: "
            f"{available}. Add the column to the dataset or set the reward's column parameter."
        )
    values = columns[name]
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise UserError(
            f"reward {reward!r}: column {name!r} must be a list, one value per completion"
        )
    return values[index]


def prompt_text(prompt: Any) -> str:
    """The user's request in a prompt: a string, or the last user message of a chat prompt."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users:
            return completion_text(users[-1])
    return completion_text(prompt)
