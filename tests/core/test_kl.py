"""KL estimators: hand values, sign, zero iff equal, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.core.kl import KL_ESTIMATORS, k1, k2, k3


def test_hand_computed() -> None:
    # logp = 0, ref = ln 2, so d = ref - logp = ln 2 = 0.693147:
    # k1 = -d = -0.693147; k2 = d^2 / 2 = 0.240227; k3 = e^d - d - 1 = 2 - 0.693147 - 1 = 0.306853.
    # logp = ln 2, ref = 0, d = -ln 2: k3 = 0.5 + 0.693147 - 1 = 0.193147.
    logp = torch.tensor([[0.0, math.log(2.0)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(2.0), 0.0]], dtype=torch.float64)
    torch.testing.assert_close(
        k1(logp, ref),
        torch.tensor([[-0.6931471805599453, 0.6931471805599453]], dtype=torch.float64),
    )
    torch.testing.assert_close(
        k2(logp, ref), torch.tensor([[0.2402265069591007] * 2], dtype=torch.float64)
    )
    torch.testing.assert_close(
        k3(logp, ref), torch.tensor([[0.3068528194400547, 0.1931471805599453]], dtype=torch.float64)
    )


def test_k3_nonnegative_and_zero_iff_equal() -> None:
    gen = torch.Generator().manual_seed(1)
    logp = -5 * torch.rand(64, 32, generator=gen)
    ref = -5 * torch.rand(64, 32, generator=gen)
    value = k3(logp, ref)
    assert (value >= 0).all()
    assert (value > 0).all()  # random values are never exactly equal
    assert (k3(logp, logp.clone()) == 0).all()


def test_k3_accurate_for_tiny_differences() -> None:
    # k3 ~ d^2 / 2 for small d: d = 1e-6 gives 5e-13, which e^d - 1 - d in float64 gets wrong.
    logp = torch.zeros(1, 1, dtype=torch.float64)
    ref = torch.full((1, 1), 1e-6, dtype=torch.float64)
    torch.testing.assert_close(
        k3(logp, ref),
        torch.full((1, 1), 5e-13 + 1e-18 / 6, dtype=torch.float64),
        rtol=1e-9,
        atol=0.0,
    )


def test_k3_gradient() -> None:
    # d k3 / d logp = 1 - exp(ref - logp): with ref - logp = ln 2 this is 1 - 2 = -1.
    logp = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(2.0)]], dtype=torch.float64)
    (grad,) = torch.autograd.grad(k3(logp, ref).sum(), logp)
    torch.testing.assert_close(grad, torch.tensor([[-1.0]], dtype=torch.float64))


def test_k3_unbiased_on_a_small_distribution() -> None:
    # Exact expectation over pi = (0.5, 0.3, 0.2) against ref = (0.2, 0.2, 0.6): E_pi[k1] and
    # E_pi[k3] both equal KL(pi || ref) = sum pi log(pi / ref).
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    kl = float((pi * (pi / ref).log()).sum())
    for fn in (k1, k3):
        expectation = float((pi * fn(pi.log()[None], ref.log()[None])[0]).sum())
        assert expectation == pytest.approx(kl, rel=1e-12)


def test_registry_and_shape_check() -> None:
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}
    with pytest.raises(ValueError, match="same shape"):
        k3(torch.zeros(2, 3), torch.zeros(2, 4))
