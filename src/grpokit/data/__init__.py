"""Prompt sets, chat formatting and built-in tasks."""

from grpokit.data.chat import encode_prompt, prompt_text, to_messages
from grpokit.data.prompts import PromptRow, check_columns, columns_of, load_prompts

__all__ = [
    "PromptRow",
    "check_columns",
    "columns_of",
    "encode_prompt",
    "load_prompts",
    "prompt_text",
    "to_messages",
]
