"""Top-k / top-p truncation against hand-computed kept sets, masses and log-probs."""

from __future__ import annotations

import math

import torch

from grpokit.core.truncation import kept_tokens, truncate_logits, truncated_log_softmax
from grpokit.rollout.next_token import filter_top_k, filter_top_p

PROBS = [0.5, 0.3, 0.15, 0.05]


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log()[None]


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    # mass before each token: 0, 0.5, 0.8, 0.95; top_p 0.9 drops the last (0.95 >= 0.9).
    logp, mass = truncated_log_softmax(_logits(PROBS), top_k=0, top_p=0.9)
    expected = [math.log(p / 0.95) for p in PROBS[:3]] + [-math.inf]
    torch.testing.assert_close(logp[0], torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(mass, torch.tensor([0.95], dtype=torch.float64))


def test_top_k_then_top_p_over_the_renormalised_top_k_set() -> None:
    # top_k 3 keeps 0.5, 0.3, 0.15 (S = 0.95), renormalised 0.5263, 0.3158, 0.1579; top_p 0.7:
    # mass before 0, 0.5263, 0.8421, so two are kept, S = 0.8.
    logp, mass = truncated_log_softmax(_logits(PROBS), top_k=3, top_p=0.7)
    expected = [math.log(0.5 / 0.8), math.log(0.3 / 0.8), -math.inf, -math.inf]
    torch.testing.assert_close(logp[0], torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(mass, torch.tensor([0.8], dtype=torch.float64))
    _, mass_k = truncated_log_softmax(_logits(PROBS), top_k=2, top_p=1.0)
    torch.testing.assert_close(mass_k, torch.tensor([0.8], dtype=torch.float64))


def test_off_keeps_everything_with_mass_one() -> None:
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0))
    logp, mass = truncated_log_softmax(logits, top_k=0, top_p=1.0)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1))
    torch.testing.assert_close(mass, torch.ones(3, 5))
    assert truncate_logits(logits, top_k=7, top_p=1.0) is logits


def test_ties_at_the_kth_logit_are_kept_and_the_top_token_always_is() -> None:
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    assert kept_tokens(logits, top_k=2, top_p=1.0).tolist() == [[True, True, True, False]]
    assert kept_tokens(logits, top_k=0, top_p=1e-6).tolist() == [[True, False, False, False]]


def test_drawn_tokens_count_as_kept() -> None:
    logits = _logits(PROBS)
    out = truncate_logits(logits, top_k=0, top_p=0.9, token_ids=torch.tensor([3]))
    torch.testing.assert_close(out, logits)  # the dropped token was drawn: all four kept
    out = truncate_logits(logits, top_k=0, top_p=0.9, token_ids=torch.tensor([0]))
    assert out[0, 3] == -math.inf


def test_the_kept_set_is_the_torch_engines_filters() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 3000, generator=gen) * 3  # some nuclei wider than the candidates
    logits[:8] = torch.randn(8, 3000, generator=gen) * 0.01
    for top_k, top_p in ((0, 0.9), (20, 1.0), (20, 0.9), (0, 0.3), (50, 0.5)):
        engine = filter_top_p(filter_top_k(logits, top_k), top_p) > -math.inf
        assert torch.equal(kept_tokens(logits, top_k=top_k, top_p=top_p), engine)


def test_gradient_of_the_truncated_log_prob_in_float64() -> None:
    logits = torch.randn(2, 3, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ids = torch.randint(9, (2, 3), generator=torch.Generator().manual_seed(3))

    def chosen(x: torch.Tensor) -> torch.Tensor:
        kept = truncate_logits(x, top_k=5, top_p=0.8, token_ids=ids)
        return torch.log_softmax(kept, -1).gather(-1, ids[..., None])

    assert torch.autograd.gradcheck(chosen, (logits.requires_grad_(),))
