"""Log-probabilities of chosen tokens and per-token entropy, computed in row chunks.

A full log-softmax over (B, T, V) costs B*T*V floats (8 x 1024 x 150k float32 = 4.9 GB), and
autograd would keep it for the backward pass. Both functions here go one sequence at a time
(``logits[b]`` is a view even when the batch was sliced, e.g. ``logits[:, :-1]``) and handle
``chunk_size`` positions at a time, so only one (chunk_size, V) block of temporaries exists at
once. Half-precision logits are upcast per chunk: logsumexp in bfloat16 loses about two decimal
digits, which shows up directly in the importance ratio.

:func:`head_logprobs` goes one step further and never holds the logits of more than two chunks:
it takes the hidden states before the output projection and projects ``chunk_size`` positions at
a time, keeping only each position's chosen log-probability (and entropy). A projection kept for
the backward pass would bring the (positions, V) logits back, so when the projection is trained
each chunk but the last is recomputed from its hidden states in the backward pass (activation
checkpointing of the projection alone: one more product of the head's size, and a log-softmax);
when it is frozen (LoRA), the gradient with respect to the hidden states is taken in the forward
pass instead, which recomputes nothing.

The log-softmax's gradient is written by hand (:class:`_SelectiveLogSoftmax`): left to autograd,
each per-sequence view ``logits[b]`` would get its own logits-sized zero gradient in the backward
pass, B full passes over B*T*V floats where one is needed (measured on the embedded model with 8
sequences a micro-batch: 0.4 s of a 5 s update).

On CPU, float32 and bfloat16 logits go through C++ kernels (grpokit/native/kernels/logits.cpp,
built by grpokit.native.build) where they build: per row, the log-sum-exp, the chosen logit and the
entropy in two reads of the row, and the gradient written straight into the logits' dtype. The
torch operations below make four or five passes, each allocating a float32 temporary of the chunk's
size, and those fresh allocations cost more than the arithmetic: on a 128k vocabulary, 2,048
positions in bfloat16, the kernels took 0.06x the torch operations' time for the log-probs and
0.10x for forward + backward (bench/logsoftmax.py; bench/RESULTS.md). The kernels sum in float32
within blocks of 2,048 values and in float64 across them; their exp is a polynomial within about 2
ulp of torch's. ``GRPOKIT_FUSED_LOGITS=0`` keeps the torch operations (for comparisons).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from grpokit.core.truncation import truncate_logits, truncates

__all__ = [
    "differentiable_entropy",
    "entropy_from_logits",
    "head_logprobs",
    "head_scores",
    "selective_log_softmax",
]

DEFAULT_CHUNK_SIZE = 512

_ENTROPY_ROWS = 128
"""Rows of a chunk's logits :func:`head_logprobs` takes the entropy of at once."""


@functools.cache
def _kernels() -> Any | None:
    """``torch.ops.grpokit_logits`` (softmax_stats, softmax_gradient), or None where they cannot
    be built (logged once) or are switched off."""
    from grpokit.native.build import load

    return load("logits", "grpokit_logits", "GRPOKIT_FUSED_LOGITS", "using torch operations")


def _native(logits: Tensor) -> Any | None:
    """The kernels, where they take these (T, V) logits: CPU, float32 or bfloat16, rows whose
    values are contiguous."""
    if (
        logits.device.type != "cpu"
        or logits.dtype not in (torch.float32, torch.bfloat16)
        or logits.ndim != 2
        or logits.shape[-1] == 0
        or logits.stride(-1) != 1
    ):
        return None
    return _kernels()


def _result_dtype(logits: Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


def _check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")


def selective_log_softmax(
    logits: Tensor,
    token_ids: Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    overwrite_logits: bool = False,
) -> Tensor:
    """log softmax(logits)[token_ids] without materialising the whole log-softmax.

    logits: (B, T, V) (any leading shape works: (..., V)); token_ids: (B, T) integer, matching the
    leading shape. Returns (B, T) in float32 (float64 for float64 logits), differentiable with
    respect to ``logits``. Equal to ``logits.log_softmax(-1).gather(-1, ids[..., None])[..., 0]``.
    ``chunk_size`` is the number of positions of one sequence processed at once.
    ``overwrite_logits``: the backward pass writes the gradient over ``logits``, for a caller
    whose logits serve nothing else (one logits-sized tensor fewer, and no fresh allocation of
    it, in the backward pass).
    """
    _check_chunk_size(chunk_size)
    if logits.ndim < 1 or tuple(token_ids.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"token_ids shape {tuple(token_ids.shape)} must equal logits shape without the "
            f"vocabulary axis {tuple(logits.shape[:-1])}"
        )
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    result: Tensor = _SelectiveLogSoftmax.apply(logits, token_ids, chunk_size, overwrite_logits)  # type: ignore[no-untyped-call]
    return result


class _SelectiveLogSoftmax(torch.autograd.Function):
    """log softmax(logits)[ids] in chunks; backward: g * (onehot(ids) - softmax(logits))."""

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, token_ids: Tensor, chunk_size: int, overwrite: bool
    ) -> Tensor:
        dtype = _result_dtype(logits)
        ids = token_ids.to(torch.long)
        lse = torch.empty(token_ids.shape, dtype=dtype, device=logits.device)
        chosen = torch.empty_like(lse)
        for seq, seq_ids, seq_lse, seq_chosen in _aligned(logits, ids, lse, chosen):
            kernels = _native(seq)
            if kernels is not None:
                seq_lse[:], seq_chosen[:], _ = kernels.softmax_stats(seq, seq_ids, False)
                continue
            for start in range(0, seq.shape[0], chunk_size):
                end = start + chunk_size
                chunk = seq[start:end].to(dtype)
                seq_lse[start:end] = torch.logsumexp(chunk, dim=-1)
                seq_chosen[start:end] = chunk.gather(-1, seq_ids[start:end, None]).squeeze(-1)
        ctx.save_for_backward(logits, ids, lse)
        ctx.chunk_size, ctx.overwrite = chunk_size, overwrite
        return chosen - lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        logits, ids, lse = ctx.saved_tensors
        # Overwritten row block by row block: each block of the gradient is computed from the
        # same block of logits before it is written.
        grad = (
            logits
            if ctx.overwrite
            else torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        )
        grad_out = grad_out.to(lse.dtype)
        for seq, seq_ids, seq_lse, seq_g, seq_grad in _aligned(logits, ids, lse, grad_out, grad):
            kernels = _native(seq)
            if kernels is not None:
                kernels.softmax_gradient(seq, seq_ids, seq_lse, seq_g, seq_grad)
                continue
            for start in range(0, seq.shape[0], ctx.chunk_size):
                end = start + ctx.chunk_size
                g = seq_g[start:end, None]
                block = -g * torch.exp(seq[start:end].to(lse.dtype) - seq_lse[start:end, None])
                block.scatter_add_(-1, seq_ids[start:end, None], g)
                seq_grad[start:end] = block
        return grad, None, None, None


def _aligned(logits: Tensor, *per_position: Tensor) -> list[tuple[Tensor, ...]]:
    """Per sequence: a (T, V) view of ``logits`` with (T,) / (T, V) views of the others.

    ``logits`` (..., T, V) may be a non-contiguous slice (e.g. ``logits[:, :-1]``); indexing the
    leading axes one at a time keeps every piece a view, where flattening would copy.
    """
    if logits.ndim == 1:
        return [tuple(t.reshape(1, *t.shape) for t in (logits, *per_position))]
    if logits.ndim == 2:
        return [(logits, *per_position)]
    out: list[tuple[Tensor, ...]] = []
    for b in range(logits.shape[0]):
        out += _aligned(logits[b], *(t[b] for t in per_position))
    return out


@torch.no_grad()
def entropy_from_logits(logits: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """Entropy of softmax(logits) per position, -sum_v p_v log p_v, without gradient (a metric).

    logits: (B, T, V) (or (..., V)). Returns (B, T) in float32 (float64 for float64 logits).
    Logits of -inf (masked vocabulary entries) contribute 0, not NaN.
    """
    _check_chunk_size(chunk_size)
    if logits.ndim < 1:
        raise ValueError("logits must have a vocabulary axis (..., V)")
    if logits.ndim > 2 and logits.shape[0] > 0:
        return torch.stack(
            [entropy_from_logits(logits[b], chunk_size=chunk_size) for b in range(logits.shape[0])]
        )
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)
    dtype = _result_dtype(logits)
    kernels = _native(rows)
    if kernels is not None and rows.shape[0] > 0:
        entropy: Tensor = kernels.softmax_stats(rows, None, True)[2]
        return entropy.reshape(logits.shape[:-1])
    pieces = []
    for start in range(0, rows.shape[0], chunk_size):
        logp = torch.log_softmax(rows[start : start + chunk_size].to(dtype), dim=-1)
        # p = 0 where logp = -inf; 0 * -inf is NaN there, where the entropy term is 0. In place,
        # in p's buffer: no further (chunk, V) temporaries (a torch.where with zeros took 3x as
        # long on the embedded model's 49k vocabulary).
        terms = logp.exp().mul_(logp).nan_to_num_(nan=0.0)
        pieces.append(-terms.sum(dim=-1))
    if not pieces:
        return torch.zeros(logits.shape[:-1], dtype=dtype, device=logits.device)
    return torch.cat(pieces).reshape(logits.shape[:-1])


def differentiable_entropy(logits: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """:func:`entropy_from_logits` with a gradient, for an entropy bonus in the loss.

    logits: (..., V). Returns (...) in float32 (float64 for float64 logits). The gradient is
    dH/dz_v = -p_v (log p_v + H), written by hand a chunk of rows at a time, so that autograd
    keeps no (rows, V) log-softmax and probabilities for the backward pass (only the logits).
    """
    _check_chunk_size(chunk_size)
    result: Tensor = _Entropy.apply(logits, chunk_size)  # type: ignore[no-untyped-call]
    return result


class _Entropy(torch.autograd.Function):
    """H = -sum_v p_v log p_v per row; backward: g * -p * (log p + H)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, chunk_size: int) -> Tensor:
        entropy = entropy_from_logits(logits.detach(), chunk_size=chunk_size)
        ctx.save_for_backward(logits, entropy)
        ctx.chunk_size = chunk_size
        return entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None]:
        logits, entropy = ctx.saved_tensors
        vocab = logits.shape[-1]
        rows = logits.reshape(-1, vocab)
        g, h = grad_out.reshape(-1, 1).to(entropy.dtype), entropy.reshape(-1, 1)
        grad = torch.empty(rows.shape, dtype=logits.dtype, device=logits.device)
        for start in range(0, rows.shape[0], ctx.chunk_size):
            end = start + ctx.chunk_size
            logp = torch.log_softmax(rows[start:end].to(entropy.dtype), dim=-1)
            # p log p is 0 where p = 0 (a -inf logit), not NaN.
            block = logp.exp().mul_(logp.add(h[start:end])).nan_to_num_(nan=0.0)
            grad[start:end] = block.mul_(-g[start:end])
        return grad.reshape(logits.shape), None


def head_logprobs(
    hidden: Tensor,
    head: Callable[[Tensor], Tensor],
    token_ids: Tensor,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    head_requires_grad: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """:func:`head_scores` without truncation: (log-probs, entropy or None)."""
    logp, entropy, _ = head_scores(
        hidden,
        head,
        token_ids,
        chunk_size=chunk_size,
        temperature=temperature,
        with_entropy=with_entropy,
        head_requires_grad=head_requires_grad,
    )
    return logp, entropy


def head_scores(
    hidden: Tensor,
    head: Callable[[Tensor], Tensor],
    token_ids: Tensor,
    *,
    chunk_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    head_requires_grad: bool = True,
    truncation: tuple[int, float] | None = None,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-probabilities of ``token_ids`` under softmax(head(hidden) / temperature), and optionally
    the entropy of that distribution, with at most ``chunk_size`` positions' logits at a time.

    ``truncation`` (top_k, top_p): the log-probs are those of the distribution truncated by top-k
    / top-p and renormalised over the kept tokens, each target counted as kept
    (grpokit.core.truncation), and the third value is log S (..., N), the log of the kept mass
    (<= 0, differentiable like the log-probs): log-probs + log S are the untruncated ones. The
    entropy stays that of the untruncated distribution. Without it the third value is None.

    ``entropy_grad``: the entropy is returned with its gradient (:func:`differentiable_entropy`),
    for an entropy bonus in the loss; it implies ``with_entropy``.

    With ``head_requires_grad`` (the head's parameters are trained) each chunk's logits but the
    last chunk's are recomputed in the backward pass (the last chunk's are kept, so at most
    chunk_size positions cost no recomputation: one chunk kept, one computed at a time). Without (a frozen head, as under LoRA) the only gradient
    wanted is the hidden states', and since position t's log-prob depends on hidden state t
    alone, d logp_t / d h_t (one H-vector per position) is computed in the forward pass, from the
    logits already there; the backward pass scales it by the incoming gradient, recomputing
    nothing.

    hidden: (..., N, H) hidden states (any leading shape; may be a non-contiguous slice);
    head: the output projection, (n, H) -> (n, V), applied row by row (each position's logits
    depend on its own hidden state only); token_ids: (..., N) integer, matching ``hidden``'s
    leading shape. Returns (log-probs (..., N), entropy (..., N) or None): float32 (float64 for
    float64 logits), the log-probs differentiable with respect to ``hidden`` and the head's
    parameters, the entropy a detached metric. Equal, up to the rounding of a product split
    into chunks, to ``selective_log_softmax(head(hidden) / temperature, token_ids)``.
    """
    truncated = truncation is not None and truncates(*truncation)
    _check_chunk_size(chunk_size)
    if tuple(token_ids.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"token_ids shape {tuple(token_ids.shape)} must equal hidden shape without the "
            f"hidden axis {tuple(hidden.shape[:-1])}"
        )
    rows, ids = hidden.reshape(-1, hidden.shape[-1]), token_ids.reshape(-1)
    with_entropy = with_entropy or entropy_grad
    stacked = truncated or entropy_grad  # the chunk's value holds several rows

    def chunk_logprobs(h: Tensor, chunk_ids: Tensor, entropy_out: list[Tensor]) -> Tensor:
        logits = head(h)
        if temperature != 1.0:
            # Upcast first: bfloat16 logits divided in bfloat16 would round once more.
            logits = logits.to(_result_dtype(logits)) / temperature
        # The backward pass runs this again; the entropy is wanted once.
        if with_entropy and not entropy_grad and not entropy_out:
            entropy_out.append(entropy_from_logits(logits.detach(), chunk_size=_ENTROPY_ROWS))
        # A differentiable entropy is one more row of the chunk's value (checkpointed and routed
        # like the log-probs); its backward reads the logits, so nothing may overwrite them.
        extra = [differentiable_entropy(logits, chunk_size=_ENTROPY_ROWS)] if entropy_grad else []
        # In their own smaller steps: a (chunk_size, V) temporary per operation of theirs would
        # double or triple the chunk's memory. The entropy makes four temporaries a step.
        # The logits are this function's own (the checkpoint recomputes them for its backward).
        if not truncated:
            logp = selective_log_softmax(logits, chunk_ids, overwrite_logits=not entropy_grad)
            return torch.stack([logp, *extra]) if extra else logp
        assert truncation is not None
        # A truncated copy beside the logits: one more (chunk_size, V) tensor. Stacked, log-probs
        # over log S, so that one value per row serves the checkpoint and the row-wise gradient.
        # A frozen head takes two backward passes over the chunk (one per row), and the first
        # must leave the logits to the second.
        top_k, top_p = truncation
        overwrite = head_requires_grad and not entropy_grad
        kept = truncate_logits(logits, top_k=top_k, top_p=top_p, token_ids=chunk_ids)
        logp = selective_log_softmax(kept, chunk_ids, overwrite_logits=overwrite)
        full = selective_log_softmax(logits, chunk_ids, overwrite_logits=overwrite)
        return torch.stack([logp, full - logp, *extra])

    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    for start in range(0, rows.shape[0], chunk_size):
        h, chunk_ids = rows[start : start + chunk_size], ids[start : start + chunk_size]
        entropy_out: list[Tensor] = []
        if torch.is_grad_enabled() and not head_requires_grad and h.requires_grad:
            with torch.enable_grad():
                detached = h.detach().requires_grad_(True)
                value = chunk_logprobs(detached, chunk_ids, entropy_out)
                if stacked:  # each row its own gradient: a backward pass per row
                    last = value.shape[0] - 1
                    logp = torch.stack(
                        [_rowwise(h, detached, value[i], retain=i < last) for i in range(last + 1)]
                    )
                else:
                    logp = _rowwise(h, detached, value, retain=False)
        elif torch.is_grad_enabled() and start + chunk_size < rows.shape[0]:
            # Keeps only h for the backward pass, not the (chunk, V) logits.
            logp = checkpoint(
                chunk_logprobs,
                h,
                chunk_ids,
                entropy_out,
                use_reentrant=False,
                preserve_rng_state=False,  # a projection draws no random numbers
            )
        else:
            logp = chunk_logprobs(h, chunk_ids, entropy_out)
        logps.append(logp)
        entropies += entropy_out
    if not logps:
        empty = hidden.new_zeros(token_ids.shape, dtype=_result_dtype(hidden))
        return empty, (empty if with_entropy else None), (empty if truncated else None)
    if not stacked:
        entropy = torch.cat(entropies).reshape(token_ids.shape) if with_entropy else None
        return torch.cat(logps).reshape(token_ids.shape), entropy, None
    both = torch.cat(logps, dim=1)
    if entropy_grad:
        entropy = both[-1].reshape(token_ids.shape)
    else:
        entropy = torch.cat(entropies).reshape(token_ids.shape) if with_entropy else None
    log_kept = both[1].reshape(token_ids.shape) if truncated else None
    return both[0].reshape(token_ids.shape), entropy, log_kept


def _rowwise(h: Tensor, detached: Tensor, value: Tensor, *, retain: bool) -> Tensor:
    """``value`` (n,), computed from ``detached`` (a detached copy of ``h`` (n, H), row t from
    row t alone), with its gradient routed to ``h`` through the per-row Jacobian taken now."""
    (jacobian,) = torch.autograd.grad(value.sum(), detached, retain_graph=retain)
    out: Tensor = _RowwiseGradient.apply(h, value.detach(), jacobian)  # type: ignore[no-untyped-call]
    return out


class _RowwiseGradient(torch.autograd.Function):
    """values (n,) of a function of h (n, H) whose row t depends on h[t] alone, with its
    per-row gradient d values_t / d h_t already computed (n, H): backward is g_t * that row."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, values: Tensor, jacobian: Tensor) -> Tensor:
        ctx.save_for_backward(jacobian)
        return values.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None]:
        (jacobian,) = ctx.saved_tensors
        return (grad_out[:, None] * jacobian).to(jacobian.dtype), None, None
