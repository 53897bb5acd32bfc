"""Turning prompts into token ids with the tokenizer's chat template."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpokit.data.prompts import Prompt, PromptRow
from grpokit.errors import UserError, read_utf8

# The separator is an expression: transformers renders templates with trim_blocks, which would
# eat a newline written after a block tag.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% if not loop.last %}{{ '\\n\\n' }}{% endif %}"
    "{% endfor %}"
)
"""``model.chat_template: plain``: the messages' texts joined by blank lines, nothing added."""

# Newlines are written as expressions for the same reason (trim_blocks).
HERMES_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    '{{ \'You may call these tools. For each call, write <tool_call>{"name": ..., '
    '"arguments": {...}}</tool_call> and end your turn; the results come back as '
    "<tool_response>...</tool_response>.\\n<tools>\\n' }}"
    "{%- for t in tools %}{{ t | tojson }}{{ '\\n' }}{%- endfor %}"
    "{{ '</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}"
    "{%- elif m['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' + (m['content'] or '') }}"
    "{%- for c in m.tool_calls or [] %}"
    "{{ '<tool_call>' }}{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "{{ '</tool_call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'tool' %}"
    "{{ '<|im_start|>tool\\n<tool_response>' + m['content'] + '</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""``model.chat_template: hermes``: ChatML (``<|im_start|>`` / ``<|im_end|>``, as SmolLM2 and Qwen
use) with tools: their schemas in the system message, calls written as ``<tool_call>{json}
</tool_call>``, results as ``tool`` messages in ``<tool_response>`` tags. For a ChatML model whose
own template cannot show tools (the embedded SmolLM2)."""

NAMED_TEMPLATES = {"plain": PLAIN_TEMPLATE, "hermes": HERMES_TEMPLATE}

AUTO = "auto"
"""``model.chat_template: auto``: the model's own template where it shows tools (the call format
the model was trained on), grpokit's :data:`HERMES_TEMPLATE` where a ChatML model's own does not
(SmolLM2), else the model's own."""

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool_5c1e",
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {}},
    },
}

NO_TEMPLATE = (
    "the tokenizer of {name} has no chat template, so grpokit cannot tell how its prompts "
    "should look. Set model.chat_template: a Jinja chat template (inline, or a .jinja file "
    "next to the config), or 'plain' to feed the messages' texts joined by blank lines"
)
"""The message for a model without a chat template and no ``model.chat_template``."""


def shows_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes the tools' schemas into a prompt (renders a
    prompt differently with ``tools``): a template with tool support."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    messages = [{"role": "user", "content": "Hello"}]
    try:
        plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        with_tools = tokenizer.apply_chat_template(
            messages, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template's own error (raise_exception, a variable it needs): no tools
        return False
    return bool(plain != with_tools)


def auto_template(tokenizer: Any) -> Any:
    """The template ``model.chat_template: auto`` gives ``tokenizer`` (see :data:`AUTO`): its
    own unless that is ChatML without tool support; None (no template) stays None."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and "<|im_start|>" in own and not shows_tools(tokenizer):
        return HERMES_TEMPLATE
    return own


def apply_template_setting(tokenizer: Any, setting: str | None, base_dir: Path) -> None:
    """Give ``tokenizer`` the chat template ``model.chat_template`` asks for: 'plain', 'hermes',
    'auto' (:data:`AUTO`), a template file (relative to ``base_dir``) or an inline template; None
    leaves it as it is."""
    if setting is None:
        return
    if setting == AUTO:
        # The model's own template is kept where it shows tools: it asks for the call format the
        # model was trained on. Under grpokit's hermes instead, Qwen2.5-Coder-0.5B-Instruct wrote
        # the call as bare JSON in 15 of 64 samples (the tool-arithmetic recipe, issue report).
        tokenizer.chat_template = auto_template(tokenizer)
        return
    if setting in NAMED_TEMPLATES:
        tokenizer.chat_template = NAMED_TEMPLATES[setting]
        return
    candidate = Path(setting).expanduser()
    candidate = candidate if candidate.is_absolute() else base_dir / candidate
    if "{" not in setting and "\n" not in setting:
        if not candidate.is_file():
            raise UserError(
                f"model.chat_template: {candidate} does not exist (give a Jinja template, a "
                "file with one, or 'plain')"
            )
        setting = read_utf8(candidate)
    tokenizer.chat_template = setting


def to_messages(prompt: Prompt, system_prompt: str | None) -> list[dict[str, str]]:
    """A prompt as chat messages, with the configured system prompt first (unless it has one)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def render_prompt(
    tokenizer: Any,
    prompt: Prompt,
    *,
    system_prompt: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt as the model reads it: the system prompt and the messages through the chat
    template, with the generation prompt and the tools' schemas (see :func:`encode_prompt`)."""
    messages = to_messages(prompt, system_prompt)
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(NO_TEMPLATE.format(name=getattr(tokenizer, "name_or_path", "the model")))
    text: str = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=True,
        **({"tools": tools} if tools else {}),
        **dict(chat_template_kwargs or {}),
    )
    return text


def encode_prompt(
    tokenizer: Any,
    prompt: Prompt,
    *,
    system_prompt: str | None = None,
    max_prompt_length: int | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of the prompt rendered with the chat template, ready for generation.

    Over-long prompts are cut from the left, keeping the end (the question and the generation
    prompt) as TRL does. A BOS goes first where the tokenizer adds one (:func:`bos_prefix`). A
    tokenizer without a chat template is refused (see :data:`PLAIN_TEMPLATE` and
    ``model.chat_template``) rather than guessed at.
    ``chat_template_kwargs`` (TRL's training.chat_template_kwargs) go to the template as
    variables, e.g. ``{"enable_thinking": False}`` for Qwen3. ``tools``: the JSON schemas of the
    tools the model may call, for the template to show it.
    """
    text = render_prompt(
        tokenizer,
        prompt,
        system_prompt=system_prompt,
        chat_template_kwargs=chat_template_kwargs,
        tools=tools,
    )
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise UserError(f"prompt {prompt!r} encodes to no tokens")
    bos = bos_prefix(tokenizer)
    if ids[: len(bos)] == bos:  # the template wrote it (Gemma's, Llama 3's)
        bos = []
    if max_prompt_length is not None and len(ids) + len(bos) > max_prompt_length:
        ids = ids[len(ids) + len(bos) - max_prompt_length :]
    return bos + ids


_BOS: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()


def bos_prefix(tokenizer: Any) -> list[int]:
    """``[bos_token_id]`` where the tokenizer puts a BOS before any text it encodes, else ``[]``.

    The rendered prompt is encoded without special tokens (the template writes the ones it
    wants), so a tokenizer that adds a BOS by itself (Gemma's: ``add_bos_token`` in its
    tokenizer_config.json and ``tokenizer.ggml.add_bos_token`` in its GGUF) would lose it where
    llama.cpp's server and transformers' ``tokenizer(text)`` keep it: a plain-template Gemma
    answered "47 + 38" with 57 without it and 49 with it. :func:`encode_prompt` adds it unless
    the template already wrote it, as the servers that run the exported model do.
    """
    try:
        return _BOS[tokenizer]
    except (KeyError, TypeError):
        pass
    bos = getattr(tokenizer, "bos_token_id", None)
    probe: list[int] = tokenizer("a", add_special_tokens=True)["input_ids"]
    found = [int(bos)] if bos is not None and probe[:1] == [bos] else []
    with contextlib.suppress(TypeError):
        _BOS[tokenizer] = found
    return found


def prompt_text(prompt: Prompt) -> str:
    """The conversation of a prompt as one text, for logs and tables: every message but the
    system prompt, joined by newlines (a string prompt as it is). The last user message alone is
    :func:`grpokit.rewards.text.user_request`."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(m["content"] for m in prompt if m["role"] != "system")


def prompts_past_context(
    tokenizer: Any,
    rows: Sequence[PromptRow],
    room: int,
    *,
    system_prompt: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[tuple[int, str]]:
    """The rows whose rendered prompt (see :func:`render_prompt`; with ``tools``, the tools'
    schemas the template writes into it) is longer than ``room`` tokens, as (index, its length
    in words: "9390 tokens").

    A text longer than ``room`` times the longest token in the vocabulary (in characters) is
    too long without counting: a 10 MB prompt is refused in milliseconds, not tokenized for a
    minute. (Each token spells at most that many characters: byte-level and SentencePiece
    vocabularies spell every byte or character they cover.)
    """
    longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
    out: list[tuple[int, str]] = []
    texts: list[tuple[int, str]] = []
    for i, row in enumerate(rows):
        text = render_prompt(
            tokenizer,
            row.prompt,
            system_prompt=system_prompt,
            chat_template_kwargs=chat_template_kwargs,
            tools=tools,
        )
        if len(text) > room * longest:
            out.append((i, f"{len(text):,} characters"))
        else:
            texts.append((i, text))
    for start in range(0, len(texts), 256):
        chunk = texts[start : start + 256]
        encoded = tokenizer([t for _, t in chunk], add_special_tokens=False)["input_ids"]
        for (i, _), ids in zip(chunk, encoded, strict=True):
            if len(ids) + len(bos_prefix(tokenizer)) > room:
                out.append((i, f"{len(ids)} tokens"))
    return sorted(out)
