"""Supervised warm-start: fine-tune on prompt/completion pairs, loss on completion tokens only.

This is the cure for the cold start (a model that never produces the format gets all-zero rewards
and GRPO has nothing to amplify). It is deliberately short and watches the policy's entropy:
an SFT that makes sampling deterministic leaves GRPO with groups of identical completions and
equal rewards, i.e. no signal again.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpokit.data.chat import encode_prompt
from grpokit.data.prompts import Prompt
from grpokit.errors import UserError
from grpokit.hub.resolve import pad_token_id
from grpokit.progress import progress
from grpokit.rollout.agent import ToolMessageTokens
from grpokit.rollout.tool_calls import call_from_json
from grpokit.rollout.tools import ToolResult
from grpokit.train.forward import completion_logprobs, pack
from grpokit.train.rollout_record import right_padded

Completion = str | list[dict[str, Any]]


@dataclass(frozen=True)
class Demonstration:
    prompt: Prompt
    completion: Completion
    """The answer: a string, or (with tools) the messages that follow the prompt: assistant
    turns, each but the last with ``tool_calls`` (TRL's form), each of those followed by one
    ``tool`` message per call."""


def check_tool_conversation(messages: list[Any]) -> str | None:
    """What is wrong with a demonstration's message completion, or None: it must alternate
    assistant turns with tool calls and their tool messages (one per call), and end with an
    assistant turn without calls."""
    expected_tools = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("assistant", "tool"):
            return f"message {i}: each must be an object with role 'assistant' or 'tool'"
        if message["role"] == "tool":
            if expected_tools == 0:
                return f"message {i}: a 'tool' message must answer a call of the turn before"
            if not isinstance(message.get("content"), str):
                return f"message {i}: a 'tool' message needs 'content' (a string)"
            expected_tools -= 1
            continue
        if expected_tools:
            return f"message {i}: {expected_tools} call(s) of the turn before have no tool message"
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
        ):
            return f"message {i}: 'tool_calls' must be a list of {{'function': {{...}}}} objects"
        for call in calls:
            if (error := call_from_json(call["function"]).error) is not None:
                return f"message {i}: {error}"
        if not isinstance(message.get("content") or "", str):
            return f"message {i}: an assistant message's 'content' must be a string"
        expected_tools = len(calls)
    if not messages or messages[-1].get("role") != "assistant" or expected_tools:
        return "the last message must be an assistant turn without tool calls"
    return None


def load_demonstrations(path: Path) -> list[Demonstration]:
    """JSONL rows with `prompt` (string or chat messages) and `completion`: a string, or with
    tools the assistant and tool messages that follow the prompt (:class:`Demonstration`)."""
    if not path.is_file():
        raise UserError(f"demonstrations file {path} does not exist")
    out = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or "prompt" not in row or "completion" not in row:
            raise UserError(f"{path}:{lineno}: each row needs 'prompt' and 'completion'")
        completion = row["completion"]
        if isinstance(completion, list):
            problem = check_tool_conversation(completion)
            if problem is not None:
                raise UserError(f"{path}:{lineno}: 'completion': {problem}")
        elif not isinstance(completion, str) or not completion:
            raise UserError(
                f"{path}:{lineno}: 'completion' must be a non-empty string or a list of "
                "assistant and tool messages"
            )
        out.append(Demonstration(row["prompt"], row["completion"]))
    if not out:
        raise UserError(f"{path}: no demonstrations")
    return out


def completion_tokens(
    tokenizer: Any,
    completion: Completion,
    *,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[int], list[int]]:
    """A demonstration's completion as token ids and their loss mask (1: trained on).

    A string is its tokens and EOS, all trained on. A tool conversation is laid out exactly as
    a multi-turn rollout lays it out (:mod:`grpokit.rollout.agent`): each assistant turn's text
    (as the chat template writes its calls) and EOS, trained on, then the tokens of its tool
    messages up to the next turn's generation prompt, masked out as GRPO masks them (the model
    reads them but never wrote them).
    """
    eos = tokenizer.eos_token_id
    if isinstance(completion, str):
        ids: list[int] = tokenizer(completion, add_special_tokens=False)["input_ids"] + [eos]
        return ids, [1] * len(ids)
    messages = ToolMessageTokens(tokenizer, tools or [], chat_template_kwargs)
    ids, mask = [], []
    for i, message in enumerate(completion):
        if message["role"] != "assistant":
            continue
        turn = tokenizer(messages.turn_text(message, eos), add_special_tokens=False)["input_ids"]
        ids += [*turn, eos]
        mask += [1] * (len(turn) + 1)
        calls = [call_from_json(c["function"]) for c in message.get("tool_calls") or []]
        if calls:
            replies = completion[i + 1 : i + 1 + len(calls)]
            results = [
                ToolResult(c.name or "", r["content"], failed=False)
                for c, r in zip(calls, replies, strict=True)
            ]
            suffix = messages.suffix_ids(eos, calls, results)
            ids += suffix
            mask += [0] * len(suffix)
    return ids, mask


def run_sft(
    model: torch.nn.Module,
    tokenizer: Any,
    demos: list[Demonstration],
    parameters: list[torch.nn.Parameter],
    *,
    system_prompt: str | None,
    max_steps: int,
    batch_size: int = 8,
    learning_rate: float = 2e-5,
    max_prompt_length: int | None = 512,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    log: Callable[[str], None] = print,
) -> list[dict[str, float]]:
    """Train `parameters` of `model` for max_steps steps; returns per-step loss and entropy.

    The completion is followed by the EOS token so the model learns to stop. Prompts are
    rendered as GRPO renders them (system prompt, truncation, chat template variables, the
    ``tools``' schemas); tool messages in a completion are read, not trained on
    (:func:`completion_tokens`).
    """
    prompts = [
        encode_prompt(
            tokenizer,
            d.prompt,
            system_prompt=system_prompt,
            max_prompt_length=max_prompt_length,
            chat_template_kwargs=chat_template_kwargs,
            tools=tools,
        )
        for d in demos
    ]
    encoded = [
        completion_tokens(
            tokenizer, d.completion, tools=tools, chat_template_kwargs=chat_template_kwargs
        )
        for d in demos
    ]
    targets = [ids for ids, _ in encoded]
    loss_masks = [torch.tensor(m, dtype=torch.float32) for _, m in encoded]
    pad = pad_token_id(tokenizer)
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.0, fused=True)
    g = torch.Generator().manual_seed(seed)
    order: list[int] = []
    history = []
    model.train()
    with progress("SFT", max_steps, log=log) as bar:
        for step in range(1, max_steps + 1):
            if len(order) < batch_size:
                order += torch.randperm(len(demos), generator=g).tolist()
            idx, order = order[:batch_size], order[batch_size:]
            t0 = time.perf_counter()
            batch = pack([prompts[i] for i in idx], [targets[i] for i in idx], pad).to(device)
            logp, entropy = completion_logprobs(model, batch, with_entropy=True)
            # Padding is 0 in the completion mask; tool messages are 0 in the loss mask.
            mask = batch.completion_mask * right_padded([loss_masks[i] for i in idx], 1.0).to(
                device
            )
            loss = -(torch.where(mask > 0, logp, 0.0)).sum() / mask.sum()
            torch.autograd.backward(loss)
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            assert entropy is not None
            ent = float((entropy * mask).sum() / mask.sum())
            value = loss.item()
            history.append(
                {"step": step, "loss": value, "entropy": ent, "time": time.perf_counter() - t0}
            )
            bar.advance(1, f"loss {value:.3f}, entropy {ent:.3f}")
            if not math.isfinite(value):
                raise UserError(f"SFT loss became {value} at step {step}; lower the learning rate")
    model.eval()
    return history
