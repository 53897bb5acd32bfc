"""Top-k / top-p truncation of a next-token distribution, as the samplers apply it (docs/math.md 2,
"Truncated sampling").

With top_k > 0 or top_p < 1 a token is drawn from the truncated distribution

    pi_trunc(v) = pi(v) / S   on the kept set K,  0 elsewhere,   S = sum_{u in K} pi(u)

where pi = softmax(logits / T) and S is the kept probability mass. A sampler that reports
log pi_trunc (vLLM's ``processed_logprobs``, grpokit's torch engine) and a trainer that recomputes
log pi differ by log S at every token, which is no mismatch at all. The trainer therefore scores
the same truncated distribution (:func:`truncate_logits`), and keeps the untruncated log pi for the
KL towards the reference.

The kept set, the rule of vLLM's sampler and of grpokit's torch engine:

- top-k: every token whose logit is at least the k-th largest of its row (ties with it are kept);
- top-p, after top-k, over the distribution renormalised on the top-k set: sorted from the most
  likely down, a token is dropped when the tokens ranked before it already hold top_p of the mass
  or more, so the most likely token is always kept.

The kept set is a constant of the computation (no gradient flows through which tokens are kept);
log pi_trunc stays differentiable in the logits through pi and S.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "TOP_P_CANDIDATES",
    "kept_tokens",
    "truncate_logits",
    "truncated_log_softmax",
    "truncates",
]

TOP_P_CANDIDATES = 1024
"""Top-p without top-k first looks for the nucleus among this many most likely tokens (a partial
top-k costs far less than sorting a whole vocabulary); rows whose nucleus is wider fall back to a
full sort, so the result is exact either way."""


def truncates(top_k: int, top_p: float, vocab: int | None = None) -> bool:
    """Whether top_k (0 = off) or top_p (1 = off) removes any token of a ``vocab``-sized row."""
    return (top_k > 0 and (vocab is None or top_k < vocab)) or top_p < 1.0


@torch.no_grad()
def kept_tokens(logits: Tensor, *, top_k: int, top_p: float) -> Tensor:
    """The kept set of each row, as a mask.

    Args:
        logits: (..., V) temperature-scaled logits (any float dtype; compared in float32 or wider).
        top_k: 0 = off. top_p: in (0, 1]; 1 = off.

    Returns:
        (..., V) bool, True on kept tokens (at least one per row).
    """
    shape, vocab = logits.shape, logits.shape[-1]
    x = logits.detach().reshape(-1, vocab)
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    keep = torch.ones_like(x, dtype=torch.bool)
    k_on = 0 < top_k < vocab
    if k_on:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        keep = x >= kth
    if top_p < 1.0 and x.shape[0] > 0:
        masked = x.masked_fill(~keep, float("-inf")) if k_on else x
        log_total = torch.logsumexp(masked, dim=-1, keepdim=True)
        # The candidates: the top-k set (ties included), or the TOP_P_CANDIDATES most likely.
        pool = int(keep.sum(dim=-1).max()) if k_on else min(vocab, TOP_P_CANDIDATES)
        values, order = torch.topk(masked, pool, dim=-1)  # sorted, most likely first
        # As the torch engine computes them (rollout.next_token), so that both find the same set.
        probs = torch.softmax(values, dim=-1) if k_on else torch.exp(values - log_total)
        if not k_on and pool < vocab and bool((probs.sum(dim=-1) < top_p).any()):
            values, order = torch.sort(masked, dim=-1, descending=True)
            probs = torch.exp(values - log_total)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        nucleus = torch.zeros_like(keep).scatter(-1, order, mass_before < top_p)
        keep = keep & nucleus
    return keep.reshape(shape)


def truncate_logits(
    logits: Tensor, *, top_k: int, top_p: float, token_ids: Tensor | None = None
) -> Tensor:
    """``logits`` with the tokens outside the kept set at -inf: log_softmax of the result is
    log pi_trunc (the module's docstring). Differentiable in ``logits``.

    Args:
        logits: (..., V) temperature-scaled logits.
        top_k, top_p: as :func:`kept_tokens`.
        token_ids: optional (...) integer: tokens counted as kept whatever the rule says (the
            tokens that were drawn: the sampler kept them, so their log-prob stays finite where
            rounding puts one of them just outside the trainer's set).

    Returns:
        (..., V), a new tensor (``logits`` itself when nothing is truncated).
    """
    if not truncates(top_k, top_p, logits.shape[-1]):
        return logits
    keep = kept_tokens(logits, top_k=top_k, top_p=top_p)
    if token_ids is not None:
        keep = keep.scatter(-1, token_ids.to(torch.long).unsqueeze(-1), True)
    return logits.masked_fill(~keep, float("-inf"))


def truncated_log_softmax(logits: Tensor, *, top_k: int, top_p: float) -> tuple[Tensor, Tensor]:
    """log pi_trunc over the whole vocabulary, and the kept mass S.

    Args:
        logits: (..., V) temperature-scaled logits.
        top_k: 0 = off. top_p: in (0, 1]; 1 = off.

    Returns:
        log-probs (..., V), -inf outside the kept set, log_softmax(logits) - log S inside it; and
        S (...), in (0, 1]. Float32 at least; differentiable in ``logits``.
    """
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    kept = truncate_logits(x, top_k=top_k, top_p=top_p)
    log_mass = torch.logsumexp(kept, dim=-1) - torch.logsumexp(x, dim=-1)
    return torch.log_softmax(kept, dim=-1), torch.exp(log_mass)
