"""What the tool-rollout tests share: chat templates with tool support (grpokit's ChatML with
Hermes-style calls, and a Llama 3 one with JSON calls), a module of tools, and engines whose token choice is scripted
(the model's sampling is not what these tests test: the loop, the masks and the tools are real).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from grpokit.data.chat import HERMES_TEMPLATE
from grpokit.rollout.base import FinishReason, RolloutBatch, RolloutEngine, SamplingParams

__all__ = [
    "HERMES_TEMPLATE",
    "LLAMA3_TEMPLATE",
    "QWEN25_TEMPLATE",
    "TOOLS_MODULE",
    "ForcedTokens",
    "ScriptedEngine",
]

# transformers renders templates with trim_blocks: newlines are written as expressions.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if tools %}{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    '{{ \'To call a function answer with only {"name": name, "parameters": {...}}.\\n\' }}'
    "{%- for t in tools %}{{ t | tojson }}{{ '\\n' }}{%- endfor %}{{ '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}"
    "{{ '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}"
    "{%- elif m['role'] == 'assistant' and m.tool_calls %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for c in m.tool_calls %}"
    "{{ {'name': c.function.name, 'parameters': c.function.arguments} | tojson }}"
    "{%- endfor %}{{ '<|eot_id|>' }}"
    "{%- else %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

# Qwen2.5-Instruct's own chat template (Qwen2.5-Coder-Instruct's too), as its tokenizer_config.json
# has it (TRL ships the same text as trl/chat_templates/qwen2_5.jinja).
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

TOOLS_MODULE = '''
import asyncio
import time


def calculator(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


async def slow_add(a: int, b: int) -> int:
    """Add two whole numbers, after a short wait.

    Args:
        a: the first term
        b: the second term
    """
    await asyncio.sleep(0.01)
    return a + b


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError("the tool broke")


def hang(x: int) -> int:
    """Never answers in time.

    Args:
        x: anything
    """
    time.sleep(30)
    return x


async def hang_async(x: int) -> int:
    """Never answers in time, asynchronously.

    Args:
        x: anything
    """
    await asyncio.sleep(30)
    return x


def huge(x: int) -> str:
    """Returns ten megabytes.

    Args:
        x: anything
    """
    return "y" * 10_000_000
'''


def hermes_call(name: str, **arguments: Any) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


Reply = Callable[[str, int], str]
"""(the context's text, the sample's index in its group) -> the text the model answers."""


def teacher_forced_logprobs(
    model: torch.nn.Module, context: list[int], ids: list[int], temperature: float
) -> torch.Tensor:
    """(len(ids),) log-probs of ``ids`` after ``context`` under ``model`` (float32, CPU)."""
    with torch.no_grad():
        inputs = torch.tensor([context + ids])
        logits = model(input_ids=inputs).logits[0, len(context) - 1 : -1].float()
        t = temperature if temperature > 0 else 1.0
        logp = torch.log_softmax(logits / t, dim=-1)
        return logp.gather(1, torch.tensor(ids)[:, None])[:, 0].cpu()


class ScriptedEngine(RolloutEngine):
    """A rollout engine whose completions are scripted by ``reply`` and scored by ``model``
    (their log-probs are the model's, as a sampler's would be). Records every call's inputs."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, reply: Reply, *, by_character: bool = False
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.reply = reply
        # Tokens of one character each: ids a re-tokenization of the text would merge, as a
        # sampler may produce.
        self.by_character = by_character
        self.eos = int(tokenizer.eos_token_id)
        self.calls: list[tuple[list[list[int]], int, int]] = []

    def sync_weights(self) -> None:
        pass

    def generate(
        self, prompt_ids: list[list[int]], n: int, params: SamplingParams, **_: Any
    ) -> RolloutBatch:
        """The scripted replies (sampling settings other than the length do not apply)."""
        self.calls.append(([list(p) for p in prompt_ids], n, params.max_completion_length))
        completions, logps, reasons = [], [], []
        for p in prompt_ids:
            context = self.tokenizer.decode(p)
            for j in range(n):
                text = self.reply(context, j)
                ids = self.encode(text) + [self.eos]
                reason: FinishReason = "eos"
                if len(ids) > params.max_completion_length:
                    ids, reason = ids[: params.max_completion_length], "length"
                completions.append(ids)
                logps.append(teacher_forced_logprobs(self.model, p, ids, params.temperature))
                reasons.append(reason)
        return RolloutBatch([list(p) for p in prompt_ids], completions, logps, reasons, n)

    def encode(self, text: str) -> list[int]:
        pieces = list(text) if self.by_character else [text]
        return [
            i
            for piece in pieces
            for i in self.tokenizer(piece, add_special_tokens=False)["input_ids"]
        ]


class ForcedTokens:
    """Stands in for grpokit.rollout.torch_engine.sample_next_tokens: at step s of the i-th
    ``generate`` call every row takes ``scripts[i][s]`` (then EOS), scored by the model's own
    ``softmax(logits / T)`` as the real sampler scores its draws. :meth:`wrap` an engine so that
    each of its generate calls starts the next script."""

    def __init__(self, scripts: list[list[int]], eos: int) -> None:
        self.scripts = list(scripts)
        self.eos = eos
        self.current: list[int] = []
        self.step = 0

    def wrap(self, engine: Any) -> Any:
        generate = engine.generate

        def scripted(*args: Any, **kwargs: Any) -> RolloutBatch:
            self.current, self.step = self.scripts.pop(0), 0
            return generate(*args, **kwargs)  # type: ignore[no-any-return]

        engine.generate = scripted
        return engine

    def __call__(
        self, logits: torch.Tensor, *, temperature: float, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        token = self.current[self.step] if self.step < len(self.current) else self.eos
        self.step += 1
        tokens = torch.full((logits.shape[0],), token, dtype=torch.long)
        logp = torch.log_softmax(logits.float() / (temperature or 1.0), dim=-1)[:, token]
        return tokens, logp
