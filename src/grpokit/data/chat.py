"""Turning prompts into token ids with the tokenizer's chat template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpokit.data.prompts import Prompt
from grpokit.errors import UserError


def to_messages(prompt: Prompt, system_prompt: str | None) -> list[dict[str, str]]:
    """A prompt as chat messages, with the configured system prompt first (unless it has one)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def encode_prompt(
    tokenizer: Any,
    prompt: Prompt,
    *,
    system_prompt: str | None = None,
    max_prompt_length: int | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of the prompt rendered with the chat template, ready for generation.

    Without a chat template the text is used as it is. Over-long prompts are cut from the left,
    keeping the end (the question and the generation prompt) as TRL does.
    ``chat_template_kwargs`` (TRL's training.chat_template_kwargs) go to the template as
    variables, e.g. ``{"enable_thinking": False}`` for Qwen3.
    """
    messages = to_messages(prompt, system_prompt)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=True,
            **dict(chat_template_kwargs or {}),
        )
    else:
        text = "\n\n".join(m["content"] for m in messages)
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise UserError(f"prompt {prompt!r} encodes to no tokens")
    if max_prompt_length is not None and len(ids) > max_prompt_length:
        ids = ids[-max_prompt_length:]
    return ids


def prompt_text(prompt: Prompt) -> str:
    """The user's text of a prompt, for logs and tables."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(m["content"] for m in prompt if m["role"] != "system")
