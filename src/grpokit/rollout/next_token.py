"""Choosing each row's next token, for a whole batch at once: repetition penalty, temperature,
top-k, top-p, min-p, and the chosen tokens' log-probs. (Sampling, in grpokit, is drawing groups of
completions from a configured policy: :mod:`grpokit.sampling`.)"""

from __future__ import annotations

import math

import torch

from grpokit.core.truncation import truncate_logits, truncates


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set every logit below the k-th largest of its row to -inf (ties with it are kept).

    Args:
        logits: (B, V).
        k: tokens to keep; 0 or >= V keeps all.

    Returns:
        (B, V), a new tensor when filtering happens.
    """
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose mass reaches ``p``.

    A token is dropped when the tokens ranked before it already hold ``p`` of the mass or more,
    so the most likely token always survives.

    Args:
        logits: (B, V).
        p: in (0, 1]; 1 keeps all.

    Returns:
        (B, V).
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


TOP_P_CANDIDATES = 1024
"""Top-p without top-k first looks for the nucleus among this many most likely tokens (a partial
top-k is far cheaper than sorting a whole vocabulary); rows whose nucleus is wider fall back to a
full sort, so the result is exact either way."""


def _inverse_cdf(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Index drawn from each row of ``probs`` (B, V), unnormalised is fine: the first column whose
    cumulative mass exceeds a uniform draw scaled to the row's total. One uniform per row and one
    cumulative sum, against V draws per row for a race: several times less work at a vocabulary
    of 49152 (bench/rollout.py measures the decoding step it is part of)."""
    cdf = probs.cumsum(dim=-1)
    noise_device = generator.device if generator is not None else probs.device
    uniform = torch.rand((probs.shape[0], 1), device=noise_device, generator=generator)
    total = cdf[:, -1:]
    # Kept below the total (u * total can round up to it), so some column's cdf exceeds it; the
    # first such column has positive mass (a zero-mass column repeats its predecessor's cdf).
    target = torch.minimum(uniform.to(probs.device) * total, torch.nextafter(total, 0 * total))
    index = torch.searchsorted(cdf, target, right=True)
    return index.squeeze(-1)


def penalize_repetition(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty, as transformers and vLLM apply it: the logit of every token
    already in the row's prompt or completion is divided by ``penalty`` when positive and
    multiplied by it when negative (> 1 discourages repeats).

    Args:
        logits: (B, V) float32. seen: (B, V) bool.

    Returns:
        (B, V), a new tensor.
    """
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def filter_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Min-p filtering: drop every token whose probability is below ``min_p`` times that of the
    row's most likely token (the ratio does not change when top-k / top-p renormalise, so it can
    be applied to the full distribution).

    Args:
        logits: (B, V) temperature-scaled logits. min_p: in (0, 1].

    Returns:
        (B, V) with dropped tokens at -inf.
    """
    # p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p)
    floor = logits.max(dim=-1, keepdim=True).values + math.log(min_p)
    return logits.masked_fill(logits < floor, float("-inf"))


def sample_next_tokens(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and score it.

    The processors apply in the order repetition penalty, temperature, top-k, top-p (over the
    distribution renormalised after top-k), min-p, as in transformers and vLLM.

    Args:
        logits: (B, V) next-token logits (any float dtype; computed in float32).
        temperature: > 0 samples from softmax(logits / T) after the filters; 0 is greedy.
        top_k: 0 = off.
        top_p: 1.0 = off.
        generator: source of randomness (on any device); None uses the global one.
        min_p: 0 = off.
        repetition_penalty: 1.0 = off; needs ``seen``, (B, V) bool, the tokens of each row's
            prompt and completion so far.

    Returns:
        tokens (B,) int64 and their log-probs (B,) float32 under the distribution they were drawn
        from, as the trainer recomputes it: softmax(logits / T) truncated by top-k / top-p and
        renormalised over the kept tokens (grpokit.core.truncation; the full softmax when neither
        truncates), before any penalty or min-p; T = 1 and no truncation when greedy.
    """
    scaled = logits.float()
    if temperature > 0 and temperature != 1.0:
        scaled = scaled / temperature
    drawn = scaled
    if repetition_penalty != 1.0 and seen is not None:
        penalized = penalize_repetition(logits.float(), seen, repetition_penalty)
        drawn = penalized / temperature if temperature > 0 else penalized
    if min_p > 0 and temperature > 0:
        drawn = filter_min_p(drawn, min_p)
    vocab = drawn.shape[-1]
    if temperature == 0 or top_k == 1:
        tokens = torch.argmax(drawn, dim=-1)
    elif truncates(top_k, top_p, vocab):
        tokens, log_kept = _sample_truncated(drawn, top_k=top_k, top_p=top_p, generator=generator)
        if drawn is scaled:  # the draw's own kept set is core.truncation's: log p - log S
            return tokens, _chosen_logprobs(scaled, tokens) - log_kept
        # A penalty or min-p changed what was drawn; the report is of the trainer's set (the
        # drawn token in it), as it recomputes it.
        kept = truncate_logits(scaled, top_k=top_k, top_p=top_p, token_ids=tokens)
        return tokens, _chosen_logprobs(kept, tokens)
    else:
        tokens = _inverse_cdf(torch.softmax(drawn, dim=-1), generator)
    return tokens, _chosen_logprobs(scaled, tokens)


def _chosen_logprobs(scaled: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(scaled)[token] per row, (B,), from ``scaled`` (B, V) float32 and ``tokens``
    (B,): the logit less the row's logsumexp, so the full (B, V) log-softmax is never written."""
    chosen = scaled.gather(-1, tokens[:, None]).squeeze(-1)
    return chosen - torch.logsumexp(scaled, dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """The log-probs (B,) float32 of ``tokens`` (B,) under softmax(logits / T) for ``logits``
    (B, V), T = 1 when ``temperature`` is 0: what :func:`sample_next_tokens` reports for the
    tokens it draws, for tokens drawn from another distribution (the reference model's, scored
    beside the policy's draws)."""
    scaled = logits.float()
    if temperature > 0 and temperature != 1.0:
        scaled = scaled / temperature
    return _chosen_logprobs(scaled, tokens)


def _sample_truncated(
    scaled: torch.Tensor,
    *,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample under top-k and/or top-p among the most likely candidates only, with the kept set
    of grpokit.core.truncation (rows where a candidate pool cannot hold it, ties at the k-th
    logit or a nucleus wider than the pool, take the exact full-vocabulary path).

    Args:
        scaled: (B, V) temperature-scaled logits.

    Returns:
        tokens (B,) and log S (B,), the log of the kept mass of softmax(scaled).
    """
    vocab = scaled.shape[-1]
    k_on = 0 < top_k < vocab
    log_total = torch.logsumexp(scaled, dim=-1)
    pool = top_k if k_on else min(vocab, TOP_P_CANDIDATES)
    values, index = torch.topk(scaled, pool, dim=-1)  # sorted, most likely first
    if k_on and bool(((scaled >= values[:, -1:]).sum(dim=-1) > top_k).any()):
        return _sample_exact(scaled, top_k=top_k, top_p=top_p, generator=generator)
    if top_p < 1.0:
        # After top-k the distribution is renormalised over the k kept tokens; without top-k the
        # pool is a prefix of the full distribution, so its probabilities are the full ones.
        if k_on:
            probs = torch.softmax(values, dim=-1)
        else:
            probs = torch.exp(values - log_total[:, None])
            if bool((probs.sum(-1) < top_p).any()):
                return _sample_exact(scaled, top_k=top_k, top_p=top_p, generator=generator)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        dropped = mass_before >= top_p
        probs = probs.masked_fill(dropped, 0.0)
        values = values.masked_fill(dropped, float("-inf"))
    else:
        probs = torch.softmax(values, dim=-1)
    tokens = index.gather(-1, _inverse_cdf(probs, generator)[:, None]).squeeze(-1)
    return tokens, torch.logsumexp(values, dim=-1) - log_total


def _sample_exact(
    scaled: torch.Tensor, *, top_k: int, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_sample_truncated` over the whole vocabulary: core.truncation's kept set."""
    kept = truncate_logits(scaled, top_k=top_k, top_p=top_p)
    tokens = _inverse_cdf(torch.softmax(kept, dim=-1), generator)
    return tokens, torch.logsumexp(kept, dim=-1) - torch.logsumexp(scaled, dim=-1)
