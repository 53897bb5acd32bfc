from __future__ import annotations

import math

import pytest
import torch

from grpokit.rollout.base import RolloutBatch, SamplingParams
from grpokit.rollout.next_token import (
    TOP_P_CANDIDATES,
    filter_top_k,
    filter_top_p,
    sample_next_tokens,
)

INF = float("-inf")


def test_filter_top_k_hand_computed() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.5, 0.5, 0.1, 0.2]])
    out = filter_top_k(logits, 2)
    assert out.tolist() == [[INF, 3.0, 2.0, INF], [0.5, 0.5, INF, INF]]
    assert filter_top_k(logits, 0) is logits
    assert filter_top_k(logits, 4) is logits


def test_filter_top_p_hand_computed() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05 (log-space logits)
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    # mass before each token: 0, 0.5, 0.8, 0.95
    assert torch.isinf(filter_top_p(logits, 0.45)).tolist() == [[False, True, True, True]]
    assert torch.isinf(filter_top_p(logits, 0.55)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_top_p(logits, 0.79)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_top_p(logits, 0.9)).tolist() == [[False, False, False, True]]
    assert torch.isinf(filter_top_p(logits, 1e-9)).tolist() == [[False, True, True, True]]
    # order of the vocabulary does not matter
    perm = torch.tensor([2, 0, 3, 1])
    shuffled = filter_top_p(logits[:, perm], 0.6)
    assert torch.isinf(shuffled).tolist() == [[True, False, True, False]]
    assert filter_top_p(logits, 1.0) is logits


def test_sampling_frequencies_follow_filtered_distribution() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    temperature, draws = 0.7, 40_000
    batch = logits.expand(draws, -1)
    gen = torch.Generator().manual_seed(0)
    tokens, logps = sample_next_tokens(
        batch, temperature=temperature, top_k=4, top_p=0.95, generator=gen
    )
    scaled = logits / temperature
    full = torch.softmax(scaled, -1)
    # top-k 4 drops token 4; then top-p 0.95 over the renormalised rest
    kept = filter_top_p(filter_top_k(scaled[None], 4), 0.95)[0]
    target = torch.softmax(kept, -1)
    freq = torch.bincount(tokens, minlength=5).double() / draws
    for p, f in zip(target.tolist(), freq.tolist(), strict=True):
        # 5 standard errors
        assert abs(p - f) <= 5 * math.sqrt(max(p * (1 - p), 1e-12) / draws) + 1e-9
    # log-probs are of the distribution drawn from: the tempered one renormalised over the kept
    # tokens, log p - log S with S the kept mass
    mass = full[~torch.isinf(kept)].sum()
    assert 0.9 < float(mass) < 1.0
    torch.testing.assert_close(logps, full.log()[tokens] - mass.log())
    torch.testing.assert_close(logps, target.log()[tokens])


def assert_frequencies(tokens: torch.Tensor, target: torch.Tensor, draws: int) -> None:
    freq = torch.bincount(tokens, minlength=target.numel()).double() / draws
    for p, f in zip(target.tolist(), freq.tolist(), strict=True):
        assert abs(p - f) <= 5 * math.sqrt(max(p * (1 - p), 1e-12) / draws) + 1e-9


def test_top_p_inside_candidate_pool_matches_reference() -> None:
    # a peaked distribution over more tokens than the pool: the nucleus fits in the pool
    vocab, draws = 3 * TOP_P_CANDIDATES, 8_000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(2)) * 4
    gen = torch.Generator().manual_seed(1)
    tokens, _ = sample_next_tokens(
        logits.expand(draws, -1), temperature=1.0, top_k=0, top_p=0.8, generator=gen
    )
    target = torch.softmax(filter_top_p(logits[None], 0.8)[0], -1)
    assert int((target > 0).sum()) < TOP_P_CANDIDATES
    assert_frequencies(tokens, target, draws)


def test_top_p_wider_than_candidate_pool_is_exact() -> None:
    # nearly flat: the nucleus of mass 0.5 holds about half of 4096 tokens, more than the pool
    vocab, draws = 4 * TOP_P_CANDIDATES, 2_500
    logits = torch.linspace(0.0, 0.01, vocab)
    gen = torch.Generator().manual_seed(3)
    tokens, _ = sample_next_tokens(
        logits.expand(draws, -1), temperature=1.0, top_k=0, top_p=0.5, generator=gen
    )
    kept = ~torch.isinf(filter_top_p(logits[None], 0.5)[0])
    assert int(kept.sum()) > TOP_P_CANDIDATES
    assert bool(kept[tokens].all())
    assert len(set(tokens.tolist())) > TOP_P_CANDIDATES


def test_top_k_alone_and_no_filter() -> None:
    logits = torch.tensor([0.3, 2.0, -1.0, 1.0, 0.0])
    draws = 30_000
    for top_k in (3, 0):
        gen = torch.Generator().manual_seed(top_k)
        tokens, _ = sample_next_tokens(
            logits.expand(draws, -1), temperature=1.3, top_k=top_k, top_p=1.0, generator=gen
        )
        target = torch.softmax(filter_top_k(logits[None] / 1.3, top_k)[0], -1)
        assert_frequencies(tokens, target, draws)


def test_greedy_modes_pick_argmax() -> None:
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(1))
    best = logits.argmax(-1)
    for kwargs in (
        {"temperature": 0.0, "top_k": 0, "top_p": 1.0},
        {"temperature": 1.0, "top_k": 1, "top_p": 1.0},
        {"temperature": 1.0, "top_k": 0, "top_p": 1e-6},
    ):
        tokens, logps = sample_next_tokens(logits, generator=None, **kwargs)  # type: ignore[arg-type]
        assert torch.equal(tokens, best)
    _, logps = sample_next_tokens(logits, temperature=0.0, top_k=0, top_p=1.0, generator=None)
    torch.testing.assert_close(logps, torch.log_softmax(logits, -1).max(-1).values)


def test_sampling_params_validation() -> None:
    assert SamplingParams(max_completion_length=4, temperature=0).greedy
    assert SamplingParams(max_completion_length=4, top_k=1).greedy
    assert not SamplingParams(max_completion_length=4).greedy
    for bad in (
        {"max_completion_length": 0},
        {"max_completion_length": 4, "temperature": -1.0},
        {"max_completion_length": 4, "top_p": 0.0},
        {"max_completion_length": 4, "top_p": 1.5},
        {"max_completion_length": 4, "top_k": -1},
    ):
        with pytest.raises(ValueError):
            SamplingParams(**bad)  # type: ignore[arg-type]


def test_rollout_batch_checks_its_layout() -> None:
    one = torch.zeros(1)
    batch = RolloutBatch([[1], [2]], [[3], [4], [5], [6]], [one] * 4, ["eos"] * 4, group_size=2)
    assert len(batch) == 4 and batch.prompt_index(3) == 1 and batch.completion_lengths == [1] * 4
    with pytest.raises(ValueError, match="needs 4 rows"):
        RolloutBatch([[1], [2]], [[3]] * 3, [one] * 3, ["eos"] * 3, group_size=2)


def test_min_p_and_repetition_penalty_hand_computed() -> None:
    from grpokit.rollout.next_token import filter_min_p, penalize_repetition

    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = ~torch.isinf(filter_min_p(probs.log(), 0.2))  # threshold 0.2 * 0.5 = 0.1
    assert kept.tolist() == [[True, True, True, False]]
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    seen = torch.tensor([[True, True, False, False]])
    assert penalize_repetition(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, 3.0]]


def test_penalty_and_min_p_change_what_is_drawn_not_the_reported_log_probs() -> None:
    logits = torch.tensor([[4.0, 3.9, -5.0]]).repeat(400, 1)
    seen = torch.zeros_like(logits, dtype=torch.bool)
    seen[:, 0] = True
    tokens, logp = sample_next_tokens(
        logits, temperature=1.0, top_k=0, top_p=1.0, generator=torch.Generator().manual_seed(0),
        repetition_penalty=4.0, seen=seen, min_p=0.5,
    )  # fmt: skip
    # Token 0 falls to logit 1.0 (p ratio e^-2.9 < 0.5 of token 1): only token 1 survives min-p.
    assert set(tokens.tolist()) == {1}
    expected = torch.log_softmax(logits[0], dim=-1)[1]
    torch.testing.assert_close(logp, expected.expand(400))


def test_engine_repetition_penalty_discourages_the_prompts_tokens(
    tiny_model: torch.nn.Module,
) -> None:
    from grpokit.rollout.torch_engine import TorchEngine

    engine = TorchEngine(tiny_model, eos_token_ids=[0], pad_token_id=0)
    prompt = [[5, 6, 7, 8, 9]]
    plain = SamplingParams(max_completion_length=16, temperature=0)
    penal = SamplingParams(max_completion_length=16, temperature=0, repetition_penalty=1e6)
    greedy = engine.generate(prompt, 1, plain).completion_ids[0]
    fresh = engine.generate(prompt, 1, penal).completion_ids[0]
    # With a huge penalty no token of the prompt or of the completion so far comes back.
    assert not set(fresh) & {5, 6, 7, 8, 9}
    assert len(set(fresh)) == len(fresh)
    assert greedy != fresh or len(set(greedy)) == len(greedy)
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        SamplingParams(max_completion_length=4, repetition_penalty=0)
    with pytest.raises(ValueError, match="min_p must be in"):
        SamplingParams(max_completion_length=4, min_p=1.5)


def test_ties_at_the_kth_logit_are_drawn_and_reported_as_vllm_keeps_them() -> None:
    """top_k 2 with the 2nd and 3rd logits equal: all three are kept (vLLM's rule, and the
    trainer's), drawn in proportion, and reported under the distribution renormalised on them."""
    logits = torch.tensor([[1.0, 0.0, 0.0, -2.0]]).expand(30_000, -1)
    gen = torch.Generator().manual_seed(0)
    tokens, logps = sample_next_tokens(logits, temperature=1.0, top_k=2, top_p=1.0, generator=gen)
    target = torch.softmax(torch.tensor([1.0, 0.0, 0.0, float("-inf")]), -1)
    assert_frequencies(tokens, target, len(tokens))
    torch.testing.assert_close(logps, target.log()[tokens])
