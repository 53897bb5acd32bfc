"""The two records of a step: a :class:`Rollout` (what collection produced: what the update
trains on and what the step reports) and the :class:`TrainBatch` micro-batches the loss consumes,
which the rollout is split into."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch

from grpokit.sampling import ScoredBatch
from grpokit.train.forward import TokenBatch, pack

_Row = TypeVar("_Row")


@dataclass
class Rollout:
    """One generation round's completions, or a step's rounds topped up into one (dynamic
    sampling): B rows, group-major, B = prompts x num_generations (a round's prompts, or the
    groups a step keeps of its rounds, round after round).

    What the update trains on:

    prompt_ids / completion_ids: B token lists, a row's prompt and its completion.
    advantages: (B,) float32.
    loss_mask_rows: (B,) float32, 0 for completions excluded from the loss (truncated, with
        mask_truncated_completions).
    sampler_logps: B float32 tensors (len(completion_ids[b]),), the sampler's log-probs of the
        sampled tokens; None when the engine gave none, or B is 0.
    tool_mask: with tools, B lists (len(completion_ids[b]),): 1 at tokens the model sampled, 0 at
        tool messages' tokens, which stay in the context but out of the loss; None without tools,
        or B is 0.
    ref_logps: B float32 tensors like sampler_logps, the reference model's log-probs of the
        sampled tokens where the engine scored them; None where the trainer computes them (and
        where B is 0).

    B is 0 (:attr:`has_rows`) where dynamic sampling dropped every group (each had equal
    rewards): nothing to train on; with several processes such a rank still joins the others'
    update.

    What the step reports (None, or empty, for rows put together directly rather than sampled):

    scored: the first round's P prompts x G completions, group-major, with their rewards (and
        their parts) and transcripts, exactly as sampled; a step's later rounds only top up its
        groups.
    scored_advantages: (P * G,) float32, the advantage of every completion of ``scored``, those
        of groups dynamic sampling dropped included.
    epoch / position: the prompt stream's resume point after the last round's prompts (the
        stream itself may be further on, at rounds taken ahead).
    indices: the first round's prompts over all ranks, as indices into the training rows, in the
        order :func:`~grpokit.train.distributed.gather_rows` puts their groups.
    metrics: a round's: generating ahead, ``staleness``, the weight updates between the policy
        that sampled the round and the one trained on it. A step's: also ``time/generate`` and
        ``time/score`` (seconds, all its rounds) and the generation rate.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: torch.Tensor
    loss_mask_rows: torch.Tensor
    sampler_logps: list[torch.Tensor] | None = None
    tool_mask: list[list[int]] | None = None
    ref_logps: list[torch.Tensor] | None = None
    scored: ScoredBatch | None = None
    scored_advantages: torch.Tensor | None = None
    epoch: int = 0
    position: int = 0
    indices: list[int] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of_round(
        cls,
        scored: ScoredBatch,
        advantages: torch.Tensor,
        *,
        mask_truncated: bool,
        epoch: int,
        position: int,
        indices: list[int],
        metrics: dict[str, float],
    ) -> Rollout:
        """Every completion of one round's ``scored`` batch with its ``advantages`` (B,);
        ``mask_truncated``: truncated completions out of the loss."""
        batch = scored.rollout
        truncated = [reason == "length" and mask_truncated for reason in batch.finish_reason]
        return cls(
            prompt_ids=scored.expanded_prompt_ids(),
            completion_ids=batch.completion_ids,
            advantages=advantages,
            loss_mask_rows=torch.tensor([0.0 if masked else 1.0 for masked in truncated]),
            sampler_logps=batch.logprobs,
            tool_mask=batch.tool_mask,
            ref_logps=batch.ref_logprobs,
            scored=scored,
            scored_advantages=advantages,
            epoch=epoch,
            position=position,
            indices=indices,
            metrics=metrics,
        )

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def has_rows(self) -> bool:
        """Whether there is anything to train on (see B = 0 above)."""
        return len(self) > 0

    def rows_at(self, index: list[int]) -> Rollout:
        """The rows ``index`` names, in its order; what the step reports stays as it is."""
        at = torch.tensor(index, dtype=torch.long)
        return replace(
            self,
            prompt_ids=[self.prompt_ids[i] for i in index],
            completion_ids=[self.completion_ids[i] for i in index],
            advantages=self.advantages[at],
            loss_mask_rows=self.loss_mask_rows[at],
            sampler_logps=_picked(self.sampler_logps, index),
            tool_mask=_picked(self.tool_mask, index),
            ref_logps=_picked(self.ref_logps, index),
        )

    def split(self, parts: int) -> list[Rollout]:
        """``parts`` consecutive slices of as equal a number of rows as can be (TRL's
        steps_per_generation: one per optimizer step); some may be empty."""
        n = len(self)
        return [
            self.rows_at(list(range(i * n // parts, (i + 1) * n // parts))) for i in range(parts)
        ]

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

    def train_batch(self, rows: slice, pad_token_id: int) -> TrainBatch:
        """The micro-batch of ``rows``, laid out as :func:`~grpokit.train.forward.pack` lays
        them out; pi_old and the trainer's pi_ref are not in it yet."""
        tokens = pack(self.prompt_ids[rows], self.completion_ids[rows], pad_token_id)
        mask = tokens.completion_mask * self.loss_mask_rows[rows][:, None]
        if self.tool_mask is not None:  # tool messages stay in the context, out of loss and KL
            tools = [torch.tensor(m, dtype=torch.float32) for m in self.tool_mask[rows]]
            mask = mask * right_padded(tools, 1.0)
        return TrainBatch(
            tokens=tokens,
            advantages=self.advantages[rows],
            loss_mask=mask,
            sampler_logps=_padded(self.sampler_logps, rows),
            ref_logps=_padded(self.ref_logps, rows),
        )

    def train_batches(
        self,
        size: int,
        token_budget: int | None = None,
        *,
        packed: bool = False,
        pad_token_id: int,
    ) -> list[TrainBatch]:
        """The rollout as micro-batches of :meth:`micro_batch_rows`, in row order."""
        rows = self.micro_batch_rows(size, token_budget, packed=packed)
        return [self.train_batch(r, pad_token_id) for r in rows]

    def active_tokens(self) -> int:
        """Completion tokens the loss counts: rows not masked out, model-sampled tokens only."""
        if self.tool_mask is None:
            lengths = torch.tensor([float(len(c)) for c in self.completion_ids])
        else:
            lengths = torch.tensor([float(sum(m)) for m in self.tool_mask])
        return int((lengths * self.loss_mask_rows).sum().item())


@dataclass
class TrainBatch:
    """One micro-batch as the loss consumes it: B rows of a :class:`Rollout`, C the longest
    completion among them (at least 1).

    tokens: the rows' prompt + completion token ids and masks
        (:class:`~grpokit.train.forward.TokenBatch`: (B, P + C) and (B, C)).
    advantages: (B,) float32.
    loss_mask: (B, C) float32, 1 on the tokens that count: completion tokens (not padding) of
        rows not masked out, sampled by the model (tool messages' tokens are 0).
    sampler_logps: (B, C) float32, the sampler's log-probs of the completions, 0 on padding;
        None without them.
    ref_logps: (B, C) float32, pi_ref's (the engine's, or the trainer's before the update);
        None where the loss needs none.
    old_logps: (B, C) float32, pi_old's, taken before the update where the loss needs them
        (several optimizer steps per generation); None otherwise (the ratio is then 1 in value).
    """

    tokens: TokenBatch
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    old_logps: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.advantages.shape[0])

    def to(self, device: torch.device | str) -> TrainBatch:
        def moved(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return TrainBatch(
            tokens=self.tokens.to(device),
            advantages=self.advantages.to(device),
            loss_mask=self.loss_mask.to(device),
            sampler_logps=moved(self.sampler_logps),
            ref_logps=moved(self.ref_logps),
            old_logps=moved(self.old_logps),
        )


def right_padded(rows: list[torch.Tensor], fill: float) -> torch.Tensor:
    """(B, C) float32: B 1-d tensors side by side, right-padded with ``fill`` to the longest
    (at least 1, as :func:`~grpokit.train.forward.pack` makes every completion)."""
    out = torch.full((len(rows), max(1, *(len(x) for x in rows))), fill, dtype=torch.float32)
    for i, values in enumerate(rows):
        out[i, : len(values)] = values
    return out


def topped_up(
    rounds: list[Rollout], kept: list[torch.Tensor], metrics: dict[str, float]
) -> Rollout:
    """One step's rollout from its generation rounds (several with dynamic sampling): the update
    trains on the rows that ``kept[r]`` ((B_r,) bool) keeps of each round ``r`` in turn; the step
    reports the first round as :meth:`Rollout.of_round` made it, with ``metrics``, and resumes
    after the last round's prompts."""
    parts = [
        r.rows_at(keep.nonzero().flatten().tolist()) for r, keep in zip(rounds, kept, strict=True)
    ]
    some = any(p.has_rows for p in parts)
    return replace(
        rounds[0],
        prompt_ids=[row for p in parts for row in p.prompt_ids],
        completion_ids=[row for p in parts for row in p.completion_ids],
        advantages=torch.cat([p.advantages for p in parts]),
        loss_mask_rows=torch.cat([p.loss_mask_rows for p in parts]),
        sampler_logps=_joined([p.sampler_logps for p in parts], some),
        tool_mask=_joined([p.tool_mask for p in parts], some),
        ref_logps=_joined([p.ref_logps for p in parts], some),
        epoch=rounds[-1].epoch,
        position=rounds[-1].position,
        metrics=metrics,
    )


def _padded(rows: list[torch.Tensor] | None, at: slice) -> torch.Tensor | None:
    """(B, C) a micro-batch's per-token values, right-padded with 0 as the completions are."""
    return None if rows is None else right_padded(rows[at], 0.0)


def _picked(rows: list[_Row] | None, index: list[int]) -> list[_Row] | None:
    return None if rows is None else [rows[i] for i in index]


def _joined(parts: list[list[_Row] | None], some: bool) -> list[_Row] | None:
    """The parts' rows in turn; None where a part has none (what they hold is then computed, or
    gone without, for every row alike), and where there are no rows to lay out."""
    if not some or any(p is None for p in parts):
        return None
    return [row for p in parts if p is not None for row in p]
