"""The completions one optimizer step trains on, and their split into micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpokit.train.forward import TokenBatch, pack


@dataclass
class Experience:
    """The completions one optimizer step trains on (B rows, group-major).

    prompt_ids / completion_ids: B token lists; advantages: (B,); loss_mask_rows: (B,) float, 0
    for completions excluded from the loss (truncated, with mask_truncated_completions).
    sampler_logps: B tensors (len(completion_ids[b]),), the sampler's log-probs of the sampled
    tokens (None when the engine gave none).
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: torch.Tensor
    loss_mask_rows: torch.Tensor
    sampler_logps: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.completion_ids)

    def micro_batch_rows(self, size: int, token_budget: int | None = None) -> list[slice]:
        """Consecutive row ranges of at most ``size`` rows and, with a budget, at most
        ``token_budget`` padded tokens (rows x (longest prompt + longest completion)); a row that
        alone exceeds the budget is a micro-batch of its own."""
        out: list[slice] = []
        start, n = 0, len(self)
        while start < n:
            end = start + 1
            p_len, c_len = len(self.prompt_ids[start]), max(1, len(self.completion_ids[start]))
            while end < n and end - start < size:
                p_next = max(p_len, len(self.prompt_ids[end]))
                c_next = max(c_len, len(self.completion_ids[end]))
                if (
                    token_budget is not None
                    and (end - start + 1) * (p_next + c_next) > token_budget
                ):
                    break
                p_len, c_len, end = p_next, c_next, end + 1
            out.append(slice(start, end))
            start = end
        return out

    def micro_batch(self, rows: slice, pad_token_id: int) -> TokenBatch:
        return pack(self.prompt_ids[rows], self.completion_ids[rows], pad_token_id)

    def sampler_logprobs(self, rows: slice) -> torch.Tensor | None:
        """(B, C) the sampler's log-probs of a micro-batch's completions, right-padded with 0 as
        :func:`~grpokit.train.forward.pack` lays the completions out; None without them."""
        if self.sampler_logps is None:
            return None
        picked = self.sampler_logps[rows]
        out = torch.zeros((len(picked), max(1, *(len(x) for x in picked))), dtype=torch.float32)
        for i, values in enumerate(picked):
            out[i, : len(values)] = values
        return out

    def active_tokens(self) -> int:
        lengths = torch.tensor([float(len(c)) for c in self.completion_ids])
        return int((lengths * self.loss_mask_rows).sum().item())
