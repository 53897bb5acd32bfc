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
    tool_mask: with tools, B lists (len(completion_ids[b]),): 1 at tokens the model sampled, 0 at
    tool messages' tokens, which stay in the context but out of the loss; None without tools.
    ref_logps: B tensors like sampler_logps, the reference model's log-probs of the sampled
    tokens where the engine scored them (None: the trainer computes them).
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: torch.Tensor
    loss_mask_rows: torch.Tensor
    sampler_logps: list[torch.Tensor] | None = None
    tool_mask: list[list[int]] | None = None
    ref_logps: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.completion_ids)

    def split(self, parts: int) -> list[Experience]:
        """``parts`` consecutive slices of as equal a number of rows as can be (TRL's
        steps_per_generation: one per optimizer step); some may be empty."""
        n = len(self)
        out = []
        for i in range(parts):
            rows = slice(i * n // parts, (i + 1) * n // parts)
            out.append(
                Experience(
                    self.prompt_ids[rows],
                    self.completion_ids[rows],
                    self.advantages[rows],
                    self.loss_mask_rows[rows],
                    None if self.sampler_logps is None else self.sampler_logps[rows],
                    None if self.tool_mask is None else self.tool_mask[rows],
                    None if self.ref_logps is None else self.ref_logps[rows],
                )
            )
        return out

    def micro_batch_rows(
        self, size: int, token_budget: int | None = None, *, packed: bool = False
    ) -> list[slice]:
        """Consecutive row ranges of at most ``size`` rows and, with a budget, at most
        ``token_budget`` tokens: padded, rows x (longest prompt + longest completion); ``packed``
        (padding-free), the rows' own prompt + completion tokens summed. A row that alone
        exceeds the budget is a micro-batch of its own."""
        out: list[slice] = []
        start, n = 0, len(self)
        while start < n:
            end = start + 1
            p_len, c_len = len(self.prompt_ids[start]), max(1, len(self.completion_ids[start]))
            total = p_len + len(self.completion_ids[start])
            while end < n and end - start < size:
                p_next = max(p_len, len(self.prompt_ids[end]))
                c_next = max(c_len, len(self.completion_ids[end]))
                total_next = total + len(self.prompt_ids[end]) + len(self.completion_ids[end])
                tokens = total_next if packed else (end - start + 1) * (p_next + c_next)
                if token_budget is not None and tokens > token_budget:
                    break
                p_len, c_len, total, end = p_next, c_next, total_next, end + 1
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
        return right_padded(self.sampler_logps[rows], 0.0)

    def ref_logprobs(self, rows: slice) -> torch.Tensor | None:
        """(B, C) the engine's reference log-probs of a micro-batch's completions, laid out as
        :meth:`sampler_logprobs`; None without them."""
        if self.ref_logps is None:
            return None
        return right_padded(self.ref_logps[rows], 0.0)

    def tool_mask_of(self, rows: slice) -> torch.Tensor | None:
        """(B, C) float: a micro-batch's tool masks, laid out as :func:`~grpokit.train.forward.pack`
        lays its completions out (1 on the right padding, which the completion mask zeroes);
        None without tools."""
        if self.tool_mask is None:
            return None
        return right_padded(
            [torch.tensor(m, dtype=torch.float32) for m in self.tool_mask[rows]], 1.0
        )

    def active_tokens(self) -> int:
        """Completion tokens the loss counts: rows not masked out, model-sampled tokens only."""
        if self.tool_mask is None:
            lengths = torch.tensor([float(len(c)) for c in self.completion_ids])
        else:
            lengths = torch.tensor([float(sum(m)) for m in self.tool_mask])
        return int((lengths * self.loss_mask_rows).sum().item())


def right_padded(rows: list[torch.Tensor], fill: float) -> torch.Tensor:
    """(B, C) float32: B 1-d tensors side by side, right-padded with ``fill`` to the longest
    (at least 1, as :func:`~grpokit.train.forward.pack` makes every completion)."""
    out = torch.full((len(rows), max(1, *(len(x) for x in rows))), fill, dtype=torch.float32)
    for i, values in enumerate(rows):
        out[i, : len(values)] = values
    return out
