"""Log-probabilities of chosen tokens and per-token entropy, computed in row chunks.

A full log-softmax over (B, T, V) costs B*T*V floats (8 x 1024 x 150k float32 = 4.9 GB), and
autograd would keep it for the backward pass. Both functions here go one sequence at a time
(``logits[b]`` is a view even when the batch was sliced, e.g. ``logits[:, :-1]``) and handle
``chunk_size`` positions at a time, so only one (chunk_size, V) block of temporaries exists at
once. Half-precision logits are upcast per chunk: logsumexp in bfloat16 loses about two decimal
digits, which shows up directly in the importance ratio.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["entropy_from_logits", "selective_log_softmax"]

DEFAULT_CHUNK_SIZE = 512


def _result_dtype(logits: Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


def _check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")


def selective_log_softmax(
    logits: Tensor, token_ids: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Tensor:
    """log softmax(logits)[token_ids] without materialising the whole log-softmax.

    logits: (B, T, V) (any leading shape works: (..., V)); token_ids: (B, T) integer, matching the
    leading shape. Returns (B, T) in float32 (float64 for float64 logits), differentiable with
    respect to ``logits``. Equal to ``logits.log_softmax(-1).gather(-1, ids[..., None])[..., 0]``.
    ``chunk_size`` is the number of positions of one sequence processed at once.
    """
    _check_chunk_size(chunk_size)
    if logits.ndim < 1 or tuple(token_ids.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"token_ids shape {tuple(token_ids.shape)} must equal logits shape without the "
            f"vocabulary axis {tuple(logits.shape[:-1])}"
        )
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    if logits.ndim > 2 and logits.shape[0] > 0:
        # One sequence at a time: a sliced batch such as logits[:, :-1] cannot be flattened to
        # rows without copying all of it, but each logits[b] is a view.
        return torch.stack(
            [
                selective_log_softmax(logits[b], token_ids[b], chunk_size=chunk_size)
                for b in range(logits.shape[0])
            ]
        )
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)
    ids = token_ids.reshape(-1, 1).to(torch.long)
    dtype = _result_dtype(logits)
    pieces = []
    for start in range(0, rows.shape[0], chunk_size):
        chunk = rows[start : start + chunk_size].to(dtype)
        chosen = chunk.gather(-1, ids[start : start + chunk_size]).squeeze(-1)
        pieces.append(chosen - torch.logsumexp(chunk, dim=-1))
    if not pieces:
        return torch.zeros(token_ids.shape, dtype=dtype, device=logits.device)
    return torch.cat(pieces).reshape(token_ids.shape)


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
    pieces = []
    for start in range(0, rows.shape[0], chunk_size):
        logp = torch.log_softmax(rows[start : start + chunk_size].to(dtype), dim=-1)
        p = logp.exp()
        # p = 0 where logp = -inf; 0 * -inf would be NaN, the entropy term is 0 there.
        terms = torch.where(p > 0, p * logp, torch.zeros_like(p))
        pieces.append(-terms.sum(dim=-1))
    if not pieces:
        return torch.zeros(logits.shape[:-1], dtype=dtype, device=logits.device)
    return torch.cat(pieces).reshape(logits.shape[:-1])
