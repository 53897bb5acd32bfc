"""Chunked log-probabilities and entropy against the naive full log-softmax."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.core.logprobs import entropy_from_logits, head_logprobs, selective_log_softmax


def naive(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def test_hand_computed() -> None:
    # logits (0, ln 3): softmax (0.25, 0.75); log p = (ln 0.25, ln 0.75) = (-1.386294, -0.287682).
    # Entropy -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335.
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]], dtype=torch.float64)
    ids = torch.tensor([[1, 0]])
    torch.testing.assert_close(
        selective_log_softmax(logits, ids),
        torch.tensor([[-0.2876820724517809, -1.3862943611198906]], dtype=torch.float64),
    )
    torch.testing.assert_close(
        entropy_from_logits(logits), torch.full((1, 2), 0.5623351446188083, dtype=torch.float64)
    )


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1000])
def test_equals_naive_and_gradient(chunk_size: int) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(3, 5, 11, generator=gen)).requires_grad_(True)
    ids = torch.randint(0, 11, (3, 5), generator=gen)
    got = selective_log_softmax(logits, ids, chunk_size=chunk_size)
    want = naive(logits, ids)
    torch.testing.assert_close(got, want)
    weights = torch.randn(3, 5, generator=gen)
    (g_got,) = torch.autograd.grad((got * weights).sum(), logits)
    (g_want,) = torch.autograd.grad((want * weights).sum(), logits)
    torch.testing.assert_close(g_got, g_want)
    p = logits.detach().softmax(-1)
    torch.testing.assert_close(
        entropy_from_logits(logits, chunk_size=chunk_size), -(p * p.log()).sum(-1)
    )


def test_sliced_logits_and_empty_batch() -> None:
    # logits[:, :-1] (the usual shift) is not contiguous; results must still match.
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 6, 9, generator=gen)
    ids = torch.randint(0, 9, (3, 5), generator=gen)
    sliced = logits[:, :-1]
    assert not sliced.is_contiguous()
    torch.testing.assert_close(selective_log_softmax(sliced, ids, chunk_size=2), naive(sliced, ids))
    assert selective_log_softmax(sliced[:0], ids[:0]).shape == (0, 5)
    assert entropy_from_logits(logits[:, :0]).shape == (3, 0)


def test_gradcheck_float64() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 6, (2, 3), generator=gen)
    assert torch.autograd.gradcheck(
        lambda x: selective_log_softmax(x, ids, chunk_size=4), (logits,)
    )
    # the hand-written backward through the usual shifted, non-contiguous slice, 4-D leading
    # axes, and repeated token ids within a chunk
    wide = torch.randn(2, 2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    shift_ids = torch.randint(0, 2, (2, 2, 4), generator=gen)
    assert torch.autograd.gradcheck(
        lambda x: selective_log_softmax(x[:, :, :-1], shift_ids, chunk_size=3), (wide,)
    )


def test_low_precision_is_upcast() -> None:
    gen = torch.Generator().manual_seed(3)
    logits32 = 3 * torch.randn(4, 6, 50, generator=gen)
    ids = torch.randint(0, 50, (4, 6), generator=gen)
    got = selective_log_softmax(logits32.to(torch.bfloat16), ids)
    assert got.dtype == torch.float32
    # Same bf16 inputs computed naively in float32: identical up to float32 rounding.
    torch.testing.assert_close(got, naive(logits32.to(torch.bfloat16).float(), ids))
    assert entropy_from_logits(logits32.to(torch.bfloat16)).dtype == torch.float32


def test_entropy_masked_vocabulary_and_no_grad() -> None:
    # (0, 0, -inf): two equally likely tokens, entropy ln 2; the -inf entry adds 0, not NaN.
    logits = torch.tensor([[[0.0, 0.0, -math.inf]]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    torch.testing.assert_close(entropy, torch.tensor([[math.log(2.0)]]))
    assert not entropy.requires_grad


def test_bad_arguments() -> None:
    logits = torch.zeros(2, 3, 5)
    with pytest.raises(ValueError, match="token_ids shape"):
        selective_log_softmax(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        selective_log_softmax(logits, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="chunk_size"):
        selective_log_softmax(logits, torch.zeros(2, 3, dtype=torch.long), chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(logits, chunk_size=-1)


@pytest.mark.parametrize("frozen", [False, True], ids=["trained-head", "frozen-head"])
@pytest.mark.parametrize("chunk_size", [1, 4, 7, 100])
def test_head_logprobs_equal_the_naive_projection(chunk_size: int, frozen: bool) -> None:
    """float64, so the identity holds to rounding: values, entropy, and gradients with respect to
    the hidden states (a non-contiguous slice) and the head's weight and bias (when trained;
    frozen, the hidden states' gradient is computed in the forward pass)."""
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, 11).double().requires_grad_(not frozen)
    hidden = torch.randn(3, 6, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.randint(0, 11, (3, 5), generator=gen)
    upstream = torch.randn(3, 5, dtype=torch.float64, generator=gen)
    results = []
    for chunked in (True, False):
        head.zero_grad()
        hidden.grad = None
        if chunked:
            logp, entropy = head_logprobs(
                hidden[:, :5],
                head,
                ids,
                chunk_size=chunk_size,
                temperature=0.7,
                with_entropy=True,
                head_requires_grad=not frozen,
            )
        else:
            logits = head(hidden[:, :5]) / 0.7
            logp, entropy = naive(logits, ids), entropy_from_logits(logits.detach())
        (logp * upstream).sum().backward()
        assert entropy is not None and not entropy.requires_grad
        results.append([logp.detach(), entropy, hidden.grad, head.weight.grad, head.bias.grad])
    assert (results[0][3] is None) == frozen
    for got, want in zip(*results, strict=True):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    with torch.no_grad():
        logp, entropy = head_logprobs(hidden[:, :5], head, ids, chunk_size=chunk_size)
    assert entropy is None and not logp.requires_grad
    torch.testing.assert_close(logp, naive(head(hidden[:, :5]), ids))


def test_head_logprobs_checks_its_arguments() -> None:
    head = torch.nn.Linear(4, 5)
    with pytest.raises(ValueError, match="token_ids shape"):
        head_logprobs(torch.zeros(2, 3, 4), head, torch.zeros(2, 2, dtype=torch.long), chunk_size=2)
    with pytest.raises(ValueError, match="chunk_size"):
        head_logprobs(torch.zeros(2, 3, 4), head, torch.zeros(2, 3, dtype=torch.long), chunk_size=0)
    logp, entropy = head_logprobs(
        torch.zeros(2, 0, 4),
        head,
        torch.zeros(2, 0, dtype=torch.long),
        chunk_size=2,
        with_entropy=True,
    )
    assert logp.shape == (2, 0) and entropy is not None and entropy.shape == (2, 0)
