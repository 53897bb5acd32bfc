"""Per-token log-probabilities of completions under a model, for a micro-batch.

A micro-batch row is [left-padded prompt | right-padded completion], trimmed to the longest
prompt and completion *of this micro-batch* (not of the whole batch), so padding costs little.
Only the logits of completion positions are computed (`logits_to_keep`), and the log-softmax is
the core's chunked selective one: the full (B, T, V) log-softmax is never materialised.

A GRPO micro-batch holds whole groups: G completions of the same prompt. Then each distinct prompt
is encoded once, and its keys and values (with their autograd graph) serve all its completions,
which are run after it as a continuation. The gradient is the same (the prompt's activations get
the sum of their G rows' gradients, as they would through G copies), and the forward and backward
skip (G - 1) / G of the prompt tokens, often half the tokens of a GRPO batch (a system prompt with
format instructions is as long as the answer). bench/train_step.py measures the step it is part
of; on the demo's settings (G = 8, a system prompt of about 100 tokens) the update got about a
quarter faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.core.logprobs import entropy_from_logits, selective_log_softmax
from grpokit.models.compat import cache_kwarg, is_checkpointing, new_cache
from grpokit.models.onednn import compute_autocast


@dataclass
class TokenBatch:
    """A micro-batch of prompt + completion token ids.

    input_ids, attention_mask, position_ids: (B, P + C); completion_ids, completion_mask: (B, C),
    where P is the longest prompt and C the longest completion in the micro-batch.
    prompt_rows: (U,) one row holding each of the U distinct prompts; prompt_index: (B,) which of
    them (0 .. U-1) each row's prompt is.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    prompt_rows: torch.Tensor
    prompt_index: torch.Tensor

    @property
    def completion_length(self) -> int:
        return int(self.completion_ids.shape[1])

    @property
    def prompt_length(self) -> int:
        return int(self.input_ids.shape[1]) - self.completion_length

    @property
    def shares_prompts(self) -> bool:
        """Whether some rows share a prompt (so encoding each prompt once saves work)."""
        return int(self.prompt_rows.shape[0]) < int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in self.__dict__.values()))


def pack(prompts: list[list[int]], completions: list[list[int]], pad_token_id: int) -> TokenBatch:
    """Lay out rows as [left-padded prompt | right-padded completion].

    prompts, completions: B lists of token ids (a completion may be empty).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    b = len(prompts)
    p_len = max(len(p) for p in prompts)
    c_len = max(1, max(len(c) for c in completions))
    ids = torch.full((b, p_len + c_len), pad_token_id, dtype=torch.long)
    mask = torch.zeros((b, p_len + c_len), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, p_len - len(p) : p_len] = torch.tensor(p, dtype=torch.long)
        mask[i, p_len - len(p) : p_len] = 1
        if c:
            ids[i, p_len : p_len + len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, p_len : p_len + len(c)] = 1
    # Positions count real tokens only, so left padding does not shift them.
    position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)
    first_row: dict[tuple[int, ...], int] = {}
    index = [first_row.setdefault(tuple(p), len(first_row)) for p in prompts]
    rows_of = {u: row for row, u in reversed(list(enumerate(index)))}
    return TokenBatch(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids,
        completion_ids=ids[:, p_len:],
        completion_mask=mask[:, p_len:].to(torch.float32),
        prompt_rows=torch.tensor([rows_of[u] for u in range(len(rows_of))], dtype=torch.long),
        prompt_index=torch.tensor(index, dtype=torch.long),
    )


def completion_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities (B, C) of the completion tokens, and optionally the entropy (B, C).

    Logits are divided by the sampling temperature, as the rollout sampled from logits / T.
    The entropy is a detached metric. With ``share_prompts`` (and rows that share a prompt, and
    no gradient checkpointing, which cannot keep a cache), each distinct prompt is encoded once.

    A model marked to compute in bfloat16 (``model.dtype: auto`` on a CPU that has it) runs its
    forward under CPU autocast (grpokit.models.onednn.compute_autocast); the log-softmax and the
    returned log-probs are float32 either way. The old, new and reference log-probs of GRPO all
    come from this one function, so their ratios compare like with like: on unchanged weights the
    importance ratio is exactly 1 (bfloat16 rounding cannot fake clipping).
    """
    with compute_autocast(model):
        if share_prompts and batch.shares_prompts and not is_checkpointing(model):
            parts = _shared_prompt_logits(model, batch)
        else:
            parts = [(_full_logits(model, batch), batch.completion_ids)]
    logps, entropies = [], []
    for logits, targets in parts:
        if temperature != 1.0:
            # Upcast first: bfloat16 logits divided in bfloat16 would round once more.
            logits = logits.float() / temperature
        logps.append(selective_log_softmax(logits, targets))
        if with_entropy:
            with torch.no_grad():
                entropies.append(entropy_from_logits(logits.detach()))
    logp = torch.cat(logps, dim=1) if len(logps) > 1 else logps[0]
    entropy = None
    if with_entropy:
        entropy = torch.cat(entropies, dim=1) if len(entropies) > 1 else entropies[0]
    return logp, entropy


def _full_logits(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """Logits (B, C, V) predicting each completion token, from one pass over prompt + completion."""
    c = batch.completion_length
    # The logit at position j predicts token j + 1: the last C + 1 logits cover the completion.
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=c + 1,
        use_cache=False,
    )
    logits: torch.Tensor = out.logits[:, :-1, :]
    return logits


def _shared_prompt_logits(
    model: torch.nn.Module, batch: TokenBatch
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(logits, targets) pieces covering the completion tokens, each distinct prompt encoded once.

    First the U prompts run with a cache; the cache's rows are then gathered to the B rows (a
    differentiable index, so gradients flow back into the prompt pass) and the completions run as
    a continuation. The prompt pass's last logit predicts completion token 0; the continuation
    runs tokens 0 .. C-2 (the last token predicts nothing needed) and predicts tokens 1 .. C-1.

    Returns:
        [(logits (B, 1, V), targets (B, 1)), (logits (B, C-1, V), targets (B, C-1))], the
        second only when C > 1.
    """
    p, c = batch.prompt_length, batch.completion_length
    rows, index = batch.prompt_rows, batch.prompt_index
    cache, cache_arg = new_cache(model), cache_kwarg(model)
    prompt_mask = batch.attention_mask[rows, :p]
    out = model(
        input_ids=batch.input_ids[rows, :p],
        attention_mask=prompt_mask,
        position_ids=batch.position_ids[rows, :p],
        use_cache=True,
        logits_to_keep=1,
        **{cache_arg: cache},
    )
    pieces = [(out.logits[index], batch.completion_ids[:, :1])]
    if c > 1:
        cache.batch_select_indices(index)
        out = model(
            input_ids=batch.completion_ids[:, :-1],
            attention_mask=batch.attention_mask[:, : p + c - 1],
            position_ids=batch.position_ids[:, p : p + c - 1],
            use_cache=True,
            **{cache_arg: cache},
        )
        pieces.append((out.logits, batch.completion_ids[:, 1:]))
    return pieces
