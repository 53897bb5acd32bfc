"""Per-token log-probabilities of completions under a model, for a micro-batch.

A micro-batch row is [left-padded prompt | right-padded completion], trimmed to the longest
prompt and completion *of this micro-batch* (not of the whole batch), so padding costs little.
Only the logits of completion positions are computed (`logits_to_keep`), and the log-softmax is
the core's chunked selective one: the full (B, T, V) log-softmax is never materialised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.core.logprobs import entropy_from_logits, selective_log_softmax


@dataclass
class TokenBatch:
    """A micro-batch of prompt + completion token ids.

    input_ids, attention_mask, position_ids: (B, P + C); completion_ids, completion_mask: (B, C),
    where P is the longest prompt and C the longest completion in the micro-batch.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor

    @property
    def completion_length(self) -> int:
        return int(self.completion_ids.shape[1])

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
    return TokenBatch(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids,
        completion_ids=ids[:, p_len:],
        completion_mask=mask[:, p_len:].to(torch.float32),
    )


def completion_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities (B, C) of the completion tokens, and optionally the entropy (B, C).

    Logits are divided by the sampling temperature, as the rollout sampled from logits / T.
    The entropy is a detached metric.
    """
    c = batch.completion_length
    # The logit at position j predicts token j + 1: the last C + 1 logits cover the completion.
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=c + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :]
    if temperature != 1.0:
        logits = logits / temperature
    logp = selective_log_softmax(logits, batch.completion_ids)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
    return logp, entropy
