"""The text rewards score: a completion (a string or chat messages) as one string, and the user's
request in a prompt. Reports show a completion through the same :func:`completion_text`, so a
table and a reward never disagree on what a completion said."""

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


def user_request(prompt: Any) -> str:
    """What the user asked: a string prompt as it is, or the last user message of a chat prompt
    (earlier turns and the system prompt left out). The ``{prompt}`` a judge's rubric shows, and
    the key the audits group completions by. Not :func:`grpokit.data.chat.prompt_text`, which
    joins the whole conversation for logs.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users:
            return completion_text(users[-1])
    return completion_text(prompt)
