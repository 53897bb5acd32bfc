"""Entropy control (grpokit.core.entropy): the high-entropy mask, the bonus, the adaptive
controller, the differentiable entropy, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.core.entropy import (
    EntropyControl,
    applied_entropy_coef,
    entropy_bonus,
    high_entropy_mask,
    next_entropy_coef,
)
from grpokit.core.logprobs import differentiable_entropy, entropy_from_logits, head_scores
from grpokit.core.losses import LossInputs, LossSettings, policy_loss

F64 = torch.float64

# Active entropies 0.1 0.5 0.9 0.3 | 0.7 0.2, sorted 0.1 0.2 0.3 0.5 0.7 0.9 (n = 6); the padding's
# 9.9 must not count.
ENTROPY = torch.tensor([[0.1, 0.5, 0.9, 0.3], [0.7, 0.2, 9.9, 9.9]], dtype=F64)
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=F64)


@pytest.mark.parametrize(
    ("rho", "kept"),
    [
        # quantile 1 - rho at position (n - 1)(1 - rho) of the sorted values, interpolated:
        (0.5, [[0, 1, 1, 0], [1, 0, 0, 0]]),  # pos 2.5: 0.3 + 0.5 (0.5 - 0.3) = 0.4
        (0.2, [[0, 0, 1, 0], [1, 0, 0, 0]]),  # pos 4.0: 0.7, kept (>=)
        (1.0, [[1, 1, 1, 1], [1, 1, 0, 0]]),  # pos 0: the smallest, every active token
        (0.0, [[0, 0, 1, 0], [0, 0, 0, 0]]),  # pos 5: the largest alone
        (0.7, [[0, 1, 1, 1], [1, 0, 0, 0]]),  # pos 1.5: 0.2 + 0.5 (0.3 - 0.2) = 0.25
    ],
)
def test_high_entropy_mask_hand_computed(rho: float, kept: list[list[int]]) -> None:
    got = high_entropy_mask(ENTROPY, MASK, rho)
    assert got.dtype == torch.bool
    assert got.tolist() == [[bool(v) for v in row] for row in kept]


def test_high_entropy_mask_ties_and_empty() -> None:
    flat = torch.full((2, 3), 0.5)
    assert high_entropy_mask(flat, torch.ones(2, 3), 0.2).all()  # ties at the threshold kept
    none = high_entropy_mask(flat, torch.zeros(2, 3), 0.2)
    assert not none.any()
    with pytest.raises(ValueError, match="one shape"):
        high_entropy_mask(flat, torch.ones(3, 2), 0.2)


def test_entropy_bonus_is_the_steps_token_mean() -> None:
    entropy = torch.tensor([[1.0, 2.0], [3.0, float("nan")]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=F64)
    assert entropy_bonus(entropy, mask, None).item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    bonus = entropy_bonus(entropy, mask, 6.0)  # this micro-batch's share of a 6-token step
    assert bonus.item() == pytest.approx(1.0)
    (grad,) = torch.autograd.grad(bonus, entropy)
    assert grad.tolist() == [[1 / 6, 1 / 6], [1 / 6, 0.0]]  # padding: no NaN, no gradient
    # Two halves of a step add up to the whole step's mean, however it is split.
    whole = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    ones = torch.ones(1, 4)
    halves = entropy_bonus(whole[:, :1], ones[:, :1], 4) + entropy_bonus(
        whole[:, 1:], ones[:, 1:], 4
    )
    assert halves.item() == pytest.approx(2.5)


ADAPTIVE = EntropyControl(use_adaptive_entropy=True)  # TRL's defaults: target 0.2, delta 0.005


@pytest.mark.parametrize(
    ("coef", "entropy", "after"),
    [
        (0.01, 0.1, 0.015),  # below the target: up by delta
        (0.01, 0.2, 0.015),  # at the target: up
        (0.01, 0.3, 0.005),  # above: down by delta
        (0.998, 0.1, 1.0),  # clamped to entropy_coef_max
        (0.003, 0.5, 0.0),  # clamped to entropy_coef_min
        (0.01, math.nan, 0.01),  # a step without tokens moves nothing
    ],
)
def test_adaptive_coefficient_hand_computed(coef: float, entropy: float, after: float) -> None:
    assert next_entropy_coef(ADAPTIVE, coef, entropy) == pytest.approx(after)
    assert next_entropy_coef(EntropyControl(), coef, entropy) == coef  # fixed: never moves


def test_applied_coefficient_waits_for_a_low_entropy() -> None:
    assert applied_entropy_coef(ADAPTIVE, 0.01, math.inf) == 0.0  # nothing measured yet
    assert applied_entropy_coef(ADAPTIVE, 0.01, 0.2) == 0.01
    assert applied_entropy_coef(ADAPTIVE, 0.01, 0.25) == 0.0
    fixed = EntropyControl(entropy_coef=0.01)
    assert applied_entropy_coef(fixed, 0.01, 5.0) == 0.01


def test_controller_over_four_steps() -> None:
    """Step entropies 0.5, 0.1, 0.1, 0.3 from entropy_coef 0: the coefficient applied in each
    step is the one the previous steps left, and only after a low entropy."""
    coef, last, applied = 0.0, math.inf, []
    for measured in (0.5, 0.1, 0.1, 0.3):
        applied.append(applied_entropy_coef(ADAPTIVE, coef, last))
        coef, last = next_entropy_coef(ADAPTIVE, coef, measured), measured
    assert applied == pytest.approx([0.0, 0.0, 0.005, 0.01])
    assert coef == pytest.approx(0.005)


def test_control_checks_its_settings() -> None:
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        EntropyControl(top_entropy_quantile=1.5)
    with pytest.raises(ValueError, match="entropy_coef_delta"):
        EntropyControl(entropy_coef_delta=-0.1)
    with pytest.raises(ValueError, match="entropy_coef_min"):
        EntropyControl(use_adaptive_entropy=True, entropy_coef_min=0.5, entropy_coef_max=0.1)
    assert not EntropyControl().bonus and not EntropyControl().masks_tokens
    assert ADAPTIVE.bonus  # the controller may raise a coefficient of 0
    assert EntropyControl(top_entropy_quantile=0.2).masks_tokens


def test_differentiable_entropy_hand_computed() -> None:
    # logits (0, ln 3, -inf): p = (1/4, 3/4, 0); H = 1/4 ln 4 + 3/4 ln(4/3) = 0.5623351446;
    # dH/dz_v = -p_v (ln p_v + H): -1/4 (ln 1/4 + H) = 0.2059898041, -3/4 (ln 3/4 + H) = -0.2059898041
    # (the two sum to 0: adding a constant to every logit changes nothing), 0 at the -inf logit.
    logits = torch.tensor([[0.0, math.log(3.0), -math.inf]], dtype=F64, requires_grad=True)
    entropy = differentiable_entropy(logits)
    assert entropy.item() == pytest.approx(0.5623351446, abs=1e-10)
    (grad,) = torch.autograd.grad(entropy.sum(), logits)
    want = torch.tensor([[0.2059898041, -0.2059898041, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, want, atol=1e-10, rtol=0)


def test_differentiable_entropy_gradcheck_and_value() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, dtype=F64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: differentiable_entropy(z, chunk_size=2), (logits,))
    torch.testing.assert_close(differentiable_entropy(logits).detach(), entropy_from_logits(logits))


@pytest.mark.parametrize("truncation", [None, (3, 0.9)], ids=["full", "top-k-top-p"])
@pytest.mark.parametrize("frozen", [False, True], ids=["trained-head", "frozen-head"])
def test_head_scores_entropy_gradient_equals_the_naive_one(
    frozen: bool, truncation: tuple[int, float] | None
) -> None:
    """The chunked projection's differentiable entropy (checkpointed chunks; a frozen head's
    row-wise gradients) gives the values and gradients of the whole logits' entropy."""
    gen = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(8, 11).double().requires_grad_(not frozen)
    hidden = torch.randn(3, 5, 8, dtype=F64, generator=gen, requires_grad=True)
    ids = torch.randint(0, 11, (3, 5), generator=gen)
    up_logp, up_entropy = torch.randn(2, 3, 5, dtype=F64, generator=gen)
    results = []
    for chunked in (True, False):
        head.zero_grad()
        hidden.grad = None
        if chunked:
            logp, entropy, _ = head_scores(
                hidden, head, ids, chunk_size=4, temperature=0.7, head_requires_grad=not frozen,
                truncation=truncation, entropy_grad=True,
            )  # fmt: skip
        else:
            plain, _, _ = head_scores(
                hidden, head, ids, chunk_size=100, temperature=0.7, truncation=truncation
            )
            logp, entropy = plain, differentiable_entropy(head(hidden) / 0.7)
        assert entropy is not None and entropy.requires_grad
        ((logp * up_logp).sum() + (entropy * up_entropy).sum()).backward()
        results.append([logp.detach(), entropy.detach(), hidden.grad, head.weight.grad])
    for got, want in zip(*results, strict=True):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_policy_mask_trains_the_kept_tokens_and_keeps_the_kl_on_all() -> None:
    """dapo, on-policy (ratio 1), A = (1, -1), beta 0.1, ref = logp + 0.5 (k3 = e^0.5 - 1.5 =
    0.1487213 per token), policy_mask [[1, 0], [0, 1]], 4 tokens:
    loss = (-1 + 0 + 0 + 1 + 4 * 0.1 * 0.1487213) / 4 = 0.01487213;
    d/dlogp: policy -A / 4 on the kept tokens, KL 0.1 (1 - e^0.5) / 4 = -0.01621803 on all."""
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -3.0]], dtype=F64, requires_grad=True)
    inputs = LossInputs(
        logp,
        None,
        torch.tensor([1.0, -1.0], dtype=F64),
        torch.ones(2, 2, dtype=F64),
        ref_logp=logp.detach() + 0.5,
        policy_mask=torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64),
    )
    out = policy_loss(inputs, LossSettings(loss_type="dapo", beta=0.1))
    assert out.loss.item() == pytest.approx(0.01487213, abs=1e-8)
    (grad,) = torch.autograd.grad(out.loss, logp)
    kl = 0.1 * (1 - math.exp(0.5)) / 4
    want = torch.tensor([[-0.25 + kl, kl], [kl, 0.25 + kl]], dtype=F64)
    torch.testing.assert_close(grad, want, atol=1e-12, rtol=0)
    assert out.metrics["kl"].item() == pytest.approx(math.exp(0.5) - 1.5)
