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
from grpokit.model_files.resolve import pad_token_id
from grpokit.progress import progress
from grpokit.train.forward import completion_logprobs, pack

DEFAULT_STEPS = 16
"""Few on purpose: a long SFT makes sampling deterministic and GRPO's groups equal."""
DEFAULT_LR_FULL = 2e-5
DEFAULT_LR_LORA = 2e-4


@dataclass(frozen=True)
class Demonstration:
    prompt: Prompt
    completion: str


def load_demonstrations(path: Path) -> list[Demonstration]:
    """JSONL rows with `prompt` (string or chat messages) and `completion` (string)."""
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
        if not isinstance(row["completion"], str) or not row["completion"]:
            raise UserError(f"{path}:{lineno}: 'completion' must be a non-empty string")
        out.append(Demonstration(row["prompt"], row["completion"]))
    if not out:
        raise UserError(f"{path}: no demonstrations")
    return out


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
    seed: int = 0,
    device: torch.device | str = "cpu",
    log: Callable[[str], None] = print,
) -> list[dict[str, float]]:
    """Train `parameters` of `model` for max_steps steps; returns per-step loss and entropy.

    The completion is followed by the EOS token so the model learns to stop. Prompts are
    rendered as GRPO renders them (system prompt, truncation, chat template variables).
    """
    eos = tokenizer.eos_token_id
    prompts = [
        encode_prompt(
            tokenizer,
            d.prompt,
            system_prompt=system_prompt,
            max_prompt_length=max_prompt_length,
            chat_template_kwargs=chat_template_kwargs,
        )
        for d in demos
    ]
    targets = [
        tokenizer(d.completion, add_special_tokens=False)["input_ids"] + [eos] for d in demos
    ]
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
            mask = batch.completion_mask
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
