"""Per-token log-probabilities of completions under a model, for a micro-batch.

A micro-batch row is [left-padded prompt | right-padded completion], trimmed to the longest
prompt and completion *of this micro-batch* (not of the whole batch), so padding costs little.
Only completion positions are projected to the vocabulary (`logits_to_keep`), and by default not
all at once: the model's output projection is swapped, for the call, for one that projects
``logprob_chunk_size`` positions at a time and keeps only each position's log-probability of its
token and its entropy (grpokit.core.logprobs.head_logprobs). The (B, C, V) logits of a micro-batch
(8 x 1,024 x 152k float32 = 5 GB, kept for the backward pass) never exist; two chunks' at most
do (bench/scaling.py --memory measures it). The
swap, rather than calling the decoder and the head separately, keeps the model's own forward, so
peft adapters, CPU autocast and FSDP's hooks on the root module run as they do otherwise.

A GRPO micro-batch holds whole groups: G completions of the same prompt. Then each distinct prompt
is encoded once, and its keys and values (with their autograd graph) serve all its completions,
which are run after it as a continuation. The gradient is the same (the prompt's activations get
the sum of their G rows' gradients, as they would through G copies), and the forward and backward
skip (G - 1) / G of the prompt tokens, often half the tokens of a GRPO batch (a system prompt with
format instructions is as long as the answer). bench/train_step.py measures the step it is part
of; on the demo's settings (G = 8, a system prompt of about 100 tokens) the update got about a
quarter faster.

Padding-free (``training.padding_free``): the micro-batch's B sequences, each its prompt's and its
completion's real tokens, are laid end to end in one row of sum-of-lengths tokens, with position
ids that start again at 0 for each sequence and no attention mask. transformers reads the
sequence boundaries from the position ids and keeps each sequence's attention to itself (a
block-diagonal causal mask for sdpa, eager and flex attention; variable-length kernels for
FlashAttention), so each token sees what it sees in its padded row, and the padding's work is
gone. Only the positions that predict completion tokens reach the output projection
(``logits_to_keep`` given as positions). Prompts are not shared across a group then: each
sequence carries its own prompt. Whether a model's attention really keeps packed sequences
apart is checked once per model (:func:`check_packing`), since an attention implementation that
ignores the position ids would silently let each sequence read the ones before it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.config.training import TrainingConfig
from grpokit.core.logprobs import (
    differentiable_entropy,
    entropy_from_logits,
    head_scores,
    selective_log_softmax,
)
from grpokit.core.truncation import truncate_logits, truncates
from grpokit.errors import UserError
from grpokit.models.compat import (
    cache_kwarg,
    eval_mode,
    hf_model,
    is_checkpointing,
    logits_to_keep_kwarg,
    new_cache,
)
from grpokit.models.onednn import compute_autocast

DEFAULT_LOGPROB_CHUNK_SIZE: int = TrainingConfig.model_fields["logprob_chunk_size"].default
"""Positions projected to the vocabulary at once (training.logprob_chunk_size's default)."""

Scores = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]
"""Log-probabilities (B, n) of the target tokens, when asked for their entropy (B, n), and with a
truncation log S (B, n), the log of the kept mass (log-probs + log S: the untruncated ones)."""


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
    logprob_chunk_size: int | None = DEFAULT_LOGPROB_CHUNK_SIZE,
    padding_free: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`completion_scores` without truncation: (log-probs (B, C), entropy (B, C) or None)."""
    logp, entropy, _ = completion_scores(
        model,
        batch,
        temperature=temperature,
        with_entropy=with_entropy,
        share_prompts=share_prompts,
        logprob_chunk_size=logprob_chunk_size,
        padding_free=padding_free,
    )
    return logp, entropy


def completion_scores(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = True,
    logprob_chunk_size: int | None = DEFAULT_LOGPROB_CHUNK_SIZE,
    padding_free: bool = False,
    truncation: tuple[int, float] | None = None,
    entropy_grad: bool = False,
) -> Scores:
    """Log-probabilities (B, C) of the completion tokens, and optionally the entropy (B, C).

    ``truncation`` (top_k, top_p), where either truncates: the log-probs are those of the
    sampling distribution truncated by top-k / top-p and renormalised over the kept tokens, as the
    engines draw and report them (grpokit.core.truncation; each completion token counted as
    kept), and the third value is log S (B, C), the log of the kept mass, differentiable like
    the log-probs: log-probs + log S are the untruncated ones, for the KL. The entropy is that
    of the untruncated distribution. Otherwise the third value is None.

    Logits are divided by the sampling temperature, as the rollout sampled from logits / T.
    The entropy is a detached metric, or with ``entropy_grad`` (implies ``with_entropy``)
    differentiable, for an entropy bonus in the loss. With ``share_prompts`` (and rows that share a prompt, and
    no gradient checkpointing, which cannot keep a cache), each distinct prompt is encoded once.
    ``logprob_chunk_size``: positions projected to the vocabulary at once (see the module's
    docstring); 0 or None projects all completion positions at once, as a plain forward does.
    Models whose forward changes the projection's logits (Gemma 2's soft-capping, Cohere's and
    Granite's scales) always take that path. ``padding_free``: one packed row without padding
    (see the module's docstring; ``share_prompts`` does not apply); the scores at the padding of
    the returned (B, C) tensors are 0.

    A model marked to compute in bfloat16 (``model.dtype: auto`` on a CPU that has it) runs its
    forward under CPU autocast (grpokit.models.onednn.compute_autocast); the log-softmax and the
    returned log-probs are float32 either way. The old, new and reference log-probs of GRPO all
    come from this one function, so their ratios compare like with like: on unchanged weights the
    importance ratio is exactly 1 (bfloat16 rounding cannot fake clipping).
    """
    if logprob_chunk_size is not None and (
        isinstance(logprob_chunk_size, bool)
        or not isinstance(logprob_chunk_size, int)
        or logprob_chunk_size < 0
    ):
        raise ValueError(f"logprob_chunk_size must be None or >= 0, got {logprob_chunk_size!r}")
    chunked = bool(logprob_chunk_size) and _swappable_head(model) is not None
    scoring = _Scoring(
        temperature=temperature,
        with_entropy=with_entropy or entropy_grad,
        chunk_size=logprob_chunk_size if chunked and logprob_chunk_size else 0,
        truncation=truncation if truncation is not None and truncates(*truncation) else None,
        entropy_grad=entropy_grad,
    )
    with compute_autocast(model):
        if padding_free:
            parts = [_packed_scores(model, batch, scoring)]
        elif share_prompts and batch.shares_prompts and not is_checkpointing(model):
            parts = _shared_prompt_scores(model, batch, scoring)
        else:
            parts = [_full_scores(model, batch, scoring)]

    def joined(i: int) -> torch.Tensor | None:
        pieces = [p[i] for p in parts if p[i] is not None]
        if not pieces:
            return None
        return torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]  # type: ignore[arg-type]

    logp = joined(0)
    assert logp is not None
    return logp, joined(1), joined(2)


@dataclass(frozen=True)
class _Scoring:
    """How a forward's output becomes scores: temperature, entropy or not, chunk size (0: none),
    the top-k / top-p truncation (None: none)."""

    temperature: float
    with_entropy: bool
    chunk_size: int
    truncation: tuple[int, float] | None = None
    entropy_grad: bool = False

    def of_logits(self, logits: torch.Tensor, targets: torch.Tensor) -> Scores:
        """Scores of targets (B, n) from logits (B, n, V) that are all there."""
        if self.temperature != 1.0:
            # Upcast first: bfloat16 logits divided in bfloat16 would round once more (float64
            # ones stay float64).
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / self.temperature
        logp = selective_log_softmax(logits, targets)
        entropy = None
        if self.entropy_grad:
            entropy = differentiable_entropy(logits)
        elif self.with_entropy:
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach())
        if self.truncation is None:
            return logp, entropy, None
        top_k, top_p = self.truncation
        kept = truncate_logits(logits, top_k=top_k, top_p=top_p, token_ids=targets)
        truncated = selective_log_softmax(kept, targets, overwrite_logits=True)
        return truncated, entropy, logp - truncated


def _swappable_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's output projection, if the model's logits are its output untouched (so it can
    be swapped for the chunked one): true of Llama, Qwen, Mistral, SmolLM and most others."""
    inner = hf_model(model)
    get_head = getattr(inner, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    config = getattr(inner, "config", None)
    rescaled = (
        getattr(config, "final_logit_softcapping", None) is not None  # Gemma 2 and 3
        or getattr(config, "logit_scale", None) not in (None, 1, 1.0)  # Cohere
        or getattr(config, "logits_scaling", None) not in (None, 1, 1.0)  # Granite
    )
    return head if isinstance(head, torch.nn.Module) and not rescaled else None


def _scored_forward(
    model: torch.nn.Module,
    targets: torch.Tensor,
    scoring: _Scoring,
    rows: torch.Tensor | None = None,
    **inputs: Any,
) -> Scores:
    """Run ``model(**inputs)``; its first n = targets.shape[1] kept positions predict ``targets``.

    targets: (B, n); rows: (B,) which of the forward's rows each target row reads (None: the same
    row). Chunked, the output projection is swapped for the call, and what the model returns as
    logits is the (B, n) log-probs.
    """
    n = int(targets.shape[1])
    if not scoring.chunk_size:
        logits = model(**inputs).logits
        return scoring.of_logits(logits[:, :n] if rows is None else logits[rows, :n], targets)
    head = _swappable_head(model)
    assert head is not None  # a chunk size is set only then
    trained = any(p.requires_grad for p in head.parameters())
    scores: list[Scores] = []

    def chunked(projection: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def forward(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            selected = hidden[:, :n] if rows is None else hidden[rows, :n]
            scores.append(
                head_scores(
                    selected,
                    lambda h: projection(h, *args, **kwargs),
                    targets,
                    chunk_size=scoring.chunk_size,
                    temperature=scoring.temperature,
                    with_entropy=scoring.with_entropy,
                    head_requires_grad=trained,
                    truncation=scoring.truncation,
                    entropy_grad=scoring.entropy_grad,
                )
            )
            return scores[-1][0]

        return forward

    with _forward_replaced(head, chunked):
        out = model(**inputs)
    if len(scores) != 1 or out.logits is not scores[0][0]:
        raise UserError(
            f"training.logprob_chunk_size: {type(hf_model(model)).__name__}'s forward changes "
            "what its output projection returns, so log-probs cannot be computed a chunk at a "
            "time; set training.logprob_chunk_size: 0 for this model"
        )
    return scores[0]


@contextmanager
def _forward_replaced(
    module: torch.nn.Module,
    make: Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]],
) -> Iterator[None]:
    """Within the block, ``module`` computes ``make(its own forward)``; its hooks still run."""
    own = module.__dict__.get("forward")  # a forward set on the instance (accelerate's hooks)
    module.forward = make(module.forward)
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def _full_scores(model: torch.nn.Module, batch: TokenBatch, scoring: _Scoring) -> Scores:
    """Scores (B, C) of the completion tokens, from one pass over prompt + completion."""
    c = batch.completion_length
    # The logit at position j predicts token j + 1: the first C of the last C + 1 logits cover
    # the completion.
    return _scored_forward(
        model,
        batch.completion_ids,
        scoring,
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=c + 1,
        use_cache=False,
    )


def _shared_prompt_scores(
    model: torch.nn.Module, batch: TokenBatch, scoring: _Scoring
) -> list[Scores]:
    """Scores covering the completion tokens, each distinct prompt encoded once.

    First the U prompts run with a cache; the cache's rows are then gathered to the B rows (a
    differentiable index, so gradients flow back into the prompt pass) and the completions run as
    a continuation. The prompt pass's last logit predicts completion token 0; the continuation
    runs tokens 0 .. C-2 (the last token predicts nothing needed) and predicts tokens 1 .. C-1.

    Returns:
        [scores (B, 1), scores (B, C-1)], the second only when C > 1.
    """
    p, c = batch.prompt_length, batch.completion_length
    rows, index = batch.prompt_rows, batch.prompt_index
    cache, cache_arg = new_cache(model), cache_kwarg(model)
    pieces = [
        _scored_forward(
            model,
            batch.completion_ids[:, :1],
            scoring,
            rows=index,
            input_ids=batch.input_ids[rows, :p],
            attention_mask=batch.attention_mask[rows, :p],
            position_ids=batch.position_ids[rows, :p],
            use_cache=True,
            logits_to_keep=1,
            **{cache_arg: cache},
        )
    ]
    if c > 1:
        cache.batch_select_indices(index)
        pieces.append(
            _scored_forward(
                model,
                batch.completion_ids[:, 1:],
                scoring,
                input_ids=batch.completion_ids[:, :-1],
                attention_mask=batch.attention_mask[:, : p + c - 1],
                position_ids=batch.position_ids[:, p : p + c - 1],
                use_cache=True,
                **{cache_arg: cache},
            )
        )
    return pieces


def _packed_scores(model: torch.nn.Module, batch: TokenBatch, scoring: _Scoring) -> Scores:
    """Scores (B, C) of the completion tokens, from one row of the B sequences end to end.

    Row b's real tokens (its prompt's p_b, then its completion's c_b) start at offset o_b in the
    packed row, and its completion token j at o_b + p_b + j, predicted by the position before.
    """
    check_packing(model)
    real = batch.attention_mask.bool()
    completion = batch.completion_mask.bool()
    prompt_lengths = real[:, : batch.prompt_length].sum(dim=1)
    if bool((prompt_lengths == 0).any()):
        raise ValueError("padding-free packing needs a prompt of at least one token in every row")
    lengths = real.sum(dim=1)
    offsets = lengths.cumsum(dim=0) - lengths
    j = torch.arange(batch.completion_length, device=real.device)
    predictors = (offsets + prompt_lengths - 1)[:, None] + j[None, :]
    logp, entropy, log_kept = _scored_forward(
        model,
        batch.completion_ids[completion][None],
        scoring,
        input_ids=batch.input_ids[real][None],
        position_ids=batch.position_ids[real][None],
        logits_to_keep=predictors[completion],
        use_cache=False,
    )

    def unpacked(values: torch.Tensor | None) -> torch.Tensor | None:
        if values is None:
            return None
        return values.new_zeros(completion.shape).masked_scatter(completion, values.reshape(-1))

    full = unpacked(logp)
    assert full is not None
    return full, unpacked(entropy), unpacked(log_kept)


_PACKING_CHECKED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
"""Models (the transformers model inside any wrapper) whose packed attention passed the check."""

_PROBE_TOKENS = 4


def check_packing(model: torch.nn.Module) -> None:
    """Refuse a model whose attention lets a packed sequence read the sequence before it.

    Runs once per model: two packed rows [a | b] and [a' | b] (random tokens, positions 0..3
    twice). Kept apart, b is computed by the same arithmetic in both and its logits are equal;
    an attention that ignores the position ids (an implementation transformers builds no mask
    for, a model class of its own, a recurrent layer) makes them depend on a or a'.
    """
    inner = hf_model(model)
    if inner in _PACKING_CHECKED:
        return
    name = type(inner).__name__
    implementation = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    if logits_to_keep_kwarg(model) != "logits_to_keep":
        raise UserError(
            f"training.padding_free: {name}'s forward takes no logits_to_keep, which packing "
            "needs; set training.padding_free: false for this model"
        )
    get_embeddings = getattr(inner, "get_input_embeddings", None)
    embeddings = get_embeddings() if callable(get_embeddings) else None
    vocab = int(getattr(embeddings, "num_embeddings", 2))
    device = next(inner.parameters()).device
    gen = torch.Generator().manual_seed(0)
    a, other, b = torch.randint(vocab, (3, _PROBE_TOKENS), generator=gen).to(device)
    positions = torch.arange(_PROBE_TOKENS, device=device).repeat(2)[None]
    keep = torch.arange(_PROBE_TOKENS, 2 * _PROBE_TOKENS, device=device)
    # eval mode: dropout would make the two rows differ for another reason
    with eval_mode(model), torch.no_grad():
        logits = [
            model(
                input_ids=torch.cat([first, b])[None],
                position_ids=positions,
                logits_to_keep=keep,
                use_cache=False,
            ).logits.float()
            for first in (a, other)
        ]
    scale = max(1.0, float(logits[0].abs().max()))
    if float((logits[0] - logits[1]).abs().max()) > 1e-5 * scale:
        raise UserError(
            f"training.padding_free: {name} (attention implementation {implementation!r}) "
            "lets a packed sequence attend to the one before it: its attention ignores the "
            "position ids that mark where each sequence starts. Set training.padding_free: "
            "false for this model"
        )
    _PACKING_CHECKED.add(inner)
