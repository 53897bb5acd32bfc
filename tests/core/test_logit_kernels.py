"""The log-softmax kernels (grpokit/native/kernels/logits.cpp) against the same quantities in
float64.

The bounds follow from what differs: the kernels' exp is a polynomial within 2 ulp of the true
one and they sum in float32 within blocks of 2,048 values (16-lane partial sums of at most 32
terms each, relative error under 32 * 2^-24 = 2e-6), so a log-sum-exp is within about 2e-6 of
the float64 one plus float32's rounding of the result; a gradient entry is rounded once to its
dtype (half a unit in the last place: at most 2^-24 of it in float32, 2^-8 in bfloat16) after a float32
computation within 4e-6 of it, and the chosen token's entry g (1 - p) loses p's absolute error
times |g| to cancellation. The torch operations the kernels replace are tested through the same
functions with the kernels off (test_logprobs.py runs float64, which always takes them).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grpokit.core import logprobs
from grpokit.core.logprobs import entropy_from_logits, selective_log_softmax

SUM_ERROR = 4e-6
"""Relative error of a kernel's float32 sum of exponentials (2 ulp exp, block sums), rounded up."""

HALF_ULP = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}
"""Rounding to the dtype, relative to the value: half a unit in the last place of 24 / 8 bits."""


@pytest.fixture(params=["kernels", "torch"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test once through the kernels and once through the torch operations."""
    if request.param == "kernels":
        assert logprobs._kernels() is not None, "the logit kernels did not build (see the log)"
    else:
        monkeypatch.setattr(logprobs, "_kernels", lambda: None)
    return str(request.param)


def reference(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """log-sum-exp, log p(ids), entropy and softmax in float64 of the (rounded) logits."""
    x = logits.double()
    logp = x.log_softmax(-1)
    p = logp.exp()
    entropy = -(p * logp).nan_to_num(0.0).sum(-1)
    return x.logsumexp(-1), logp.gather(-1, ids[..., None])[..., 0], entropy, p


def logits_with_masks(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = 4 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64)
    x[0, : vocab // 2] = -math.inf  # a masked half of the vocabulary
    x[1, 0] = 30.0  # one dominant token (p near 1: the gradient's cancellation)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("vocab", [3, 16, 67, 5000], ids=lambda v: f"V{v}")
def test_forward_backward_and_entropy_against_float64(
    path: str, dtype: torch.dtype, vocab: int
) -> None:
    # rows of a (2, 5, V + 2) tensor sliced to (2, 4, V): rows not contiguous with each other
    wide = logits_with_masks(10, vocab + 2, dtype, seed=vocab).reshape(2, 5, vocab + 2)
    logits = wide[:, :4, 1 : vocab + 1].detach().requires_grad_(True)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, 4), generator=gen)
    ids[0, 0] = vocab - 1  # an id in the unmasked half of the masked row
    lse, chosen, entropy, p = reference(logits.detach(), ids)

    got = selective_log_softmax(logits, ids)
    assert got.dtype == torch.float32
    scale = chosen.abs() + lse.abs()
    assert ((got.double() - chosen).abs() <= SUM_ERROR + 2 * 2.0**-24 * scale).all()
    got_entropy = entropy_from_logits(logits.detach())
    # entropy = lse - sum p x: errors of the log-sum-exp and of the weighted sum, each relative
    x_bound = logits.detach().double().nan_to_num(neginf=0.0).abs().amax(-1)
    bound = 2 * SUM_ERROR * (1 + x_bound) + 2.0**-22 * (lse.abs() + x_bound)
    assert ((got_entropy.double() - entropy).abs() <= bound).all()

    grad_out = torch.randn(2, 4, generator=gen)
    got.backward(grad_out)
    assert logits.grad is not None and logits.grad.dtype == dtype
    g = grad_out.double()[..., None]
    want = -g * p
    want.scatter_add_(-1, ids[..., None], g)
    error = (logits.grad.double() - want).abs()
    bound = HALF_ULP[dtype] * want.abs() + 2 * SUM_ERROR * (p + 1e-30) * g.abs() + 1e-30
    # the chosen entries: p's absolute error (at most SUM_ERROR of 1) times |g|, then rounding
    bound.scatter_add_(-1, ids[..., None], SUM_ERROR * g.abs())
    assert (error <= bound).all(), (error / bound).max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gradient_written_over_the_logits_is_the_same_gradient(
    path: str, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(6, 8, generator=gen).requires_grad_(True)
    weight = torch.randn(70, 8, generator=gen).to(dtype)
    ids = torch.randint(0, 70, (6,), generator=gen)
    ids[1] = ids[0]  # a repeated id
    grads, kept = [], []
    for overwrite in (False, True):
        logits = hidden.to(dtype) @ weight.T  # the logits are this computation's own
        kept.append(logits.detach().clone())
        logp = selective_log_softmax(logits, ids, chunk_size=4, overwrite_logits=overwrite)
        (grad,) = torch.autograd.grad(logp.sum(), hidden)
        grads.append(grad)
        after = logits.detach()
        if overwrite:
            # the storage now holds d(sum logp)/d(logits) = onehot(ids) - softmax, to the rounding
            want = -torch.softmax(kept[-1].double(), dim=-1)
            want.scatter_add_(-1, ids[:, None], torch.ones(6, 1, dtype=torch.float64))
            assert (after.double() - want).abs().max() <= HALF_ULP[dtype] + 2 * SUM_ERROR
        else:
            assert torch.equal(after, kept[-1])  # left as it was
    assert torch.equal(grads[0], grads[1])


def test_rows_of_one_value_and_all_masked(path: str) -> None:
    logits = torch.tensor([[0.0, -math.inf, -math.inf], [-math.inf] * 3, [2.0, 2.0, 2.0]])
    ids = torch.tensor([0, 1, 2])
    got = selective_log_softmax(logits, ids)
    assert got[0].item() == 0.0  # the only possible token: log 1
    assert math.isnan(got[1].item())  # -inf - (-inf), as torch's log-softmax gives
    assert got[2].item() == pytest.approx(-math.log(3.0), abs=1e-6)
    entropy = entropy_from_logits(logits)
    assert entropy[:2].tolist() == [0.0, 0.0]
    assert entropy[2].item() == pytest.approx(math.log(3.0), abs=1e-6)


def test_nan_logits_stay_nan(path: str) -> None:
    logits = torch.tensor([[0.0, math.nan, 1.0], [0.0, 1.0, 2.0]])
    got = selective_log_softmax(logits, torch.tensor([0, 0]))
    assert math.isnan(got[0].item()) and not math.isnan(got[1].item())
    if path == "kernels":
        # (the torch operations' nan_to_num, there for the -inf entries, zeroes a NaN row's terms)
        assert math.isnan(entropy_from_logits(logits)[0].item())


def test_kernels_refuse_ids_outside_the_vocabulary() -> None:
    kernels = logprobs._kernels()
    assert kernels is not None
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        kernels.softmax_stats(torch.zeros(2, 5), torch.tensor([0, 5]), False)


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPOKIT_FUSED_LOGITS", "0")
    logprobs._kernels.cache_clear()
    try:
        assert logprobs._kernels() is None
    finally:
        monkeypatch.delenv("GRPOKIT_FUSED_LOGITS")
        logprobs._kernels.cache_clear()
    assert logprobs._kernels() is not None


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags", [["-mno-avx512f"], ["-mno-avx512f", "-mno-avx2"]], ids=["avx2", "plain-loops"]
)
def test_the_code_paths_for_cpus_without_avx512(tmp_path: Path, flags: list[str]) -> None:
    """The kernels' other code paths (AVX2 intrinsics where the CPU has AVX2, else plain loops),
    built without AVX-512 and compared in a fresh process (two builds of one operator library
    cannot load into one process). 1,003 values a row: whole 32- and 8-lane steps and a tail."""
    from grpokit.native.build import build

    library = build("logits", tmp_path, extra_flags=flags)
    script = textwrap.dedent(
        f"""
        import math, torch
        torch.ops.load_library({str(library)!r})
        ops = torch.ops.grpokit_logits
        gen = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16):
            x = (4 * torch.randn(6, 1003, generator=gen, dtype=torch.float64))
            x[0, :500] = -math.inf
            x = x.to(dtype)
            ids = torch.randint(500, 1003, (6,), generator=gen)
            lse, chosen, entropy = ops.softmax_stats(x, ids, True)
            d = x.double()
            logp = d.log_softmax(-1)
            want_entropy = -(logp.exp() * logp).nan_to_num(0.0).sum(-1)
            assert (lse.double() - d.logsumexp(-1)).abs().max() < 1e-4, dtype
            assert torch.equal(chosen, d.gather(-1, ids[:, None])[:, 0].float()), dtype
            assert (entropy.double() - want_entropy).abs().max() < 1e-4, dtype
            g = torch.randn(6, generator=gen)
            out = torch.empty_like(x)
            ops.softmax_gradient(x, ids, lse, g, out)
            want = -g.double()[:, None] * logp.exp()
            want[torch.arange(6), ids] += g.double()
            assert ((out.double() - want).abs() <= 2**-8 * want.abs() + 1e-5).all(), dtype
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
