"""policy_loss: hand-computed values, REINFORCE limit, padding, micro-batches, gradcheck, errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from grpokit.core.losses import (
    LOSS_TYPES as REGISTERED,
)
from grpokit.core.losses import (
    LossInputs,
    LossOutput,
    LossSettings,
    MismatchCorrection,
    StepCounts,
    policy_loss,
    reduce,
)

F64 = torch.float64
LOSS_TYPES = ["bnpo", "dapo", "dr_grpo", "grpo"]  # the clipped surrogate's four normalisers
KL = "kl"
LOW, HIGH, REGION = "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"


def compute(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    num_active_tokens: float | None = None,
    num_sequences: int | None = None,
    max_completion_length: int | None = None,
    **settings: Any,
) -> LossOutput:
    """policy_loss on these tensors, with the step counts and the settings as keywords."""
    counts = StepCounts(num_active_tokens, num_sequences, max_completion_length)
    return policy_loss(
        LossInputs(logp, old_logp, advantages, mask, ref_logp, counts), LossSettings(**settings)
    )


def tensor(values: Any) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def loss_and_grad(logp: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[LossOutput, torch.Tensor]:
    leaf = logp.detach().clone().requires_grad_(True)
    out = compute(leaf, *args, **kwargs)
    (grad,) = torch.autograd.grad(out.loss, leaf)
    return out, grad


def random_batch(b: int = 4, t: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logp = -3 * torch.rand(b, t, generator=gen, dtype=F64)
    old = logp + 0.3 * torch.randn(b, t, generator=gen, dtype=F64)
    ref = logp + 0.3 * torch.randn(b, t, generator=gen, dtype=F64)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    adv = torch.randn(b, generator=gen, dtype=F64)
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "adv": adv}


def test_aggregations_hand_computed() -> None:
    # ratio 1 everywhere (logp == old), A = (1, -1), mask rows (1, 1, 0) and (1, 0, 0).
    # Per-token losses -A: row 0 (-1, -1), row 1 (1).
    #   grpo: mean(-2/2, 1/1) = 0;  bnpo: (-2 + 1) / 3 = -1/3;  dapo with 6 tokens: -1/6;
    #   dr_grpo with max_completion_length 4: -1 / (2 * 4) = -0.125.
    logp = tensor([[-1.0, -2.0, -3.0], [-0.5, -0.1, -0.2]])
    adv = tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    expected = {"grpo": 0.0, "bnpo": -1 / 3, "dapo": -1 / 6, "dr_grpo": -0.125}
    for loss_type, value in expected.items():
        out = compute(
            logp,
            logp,
            adv,
            mask,
            loss_type=loss_type,
            num_active_tokens=6 if loss_type == "dapo" else None,
            max_completion_length=4,
        )
        assert out.loss.item() == pytest.approx(value, abs=1e-12), loss_type
    # dapo without num_active_tokens uses this batch's 3 tokens, like bnpo.
    out = compute(logp, logp, adv, mask, loss_type="dapo")
    assert out.loss.item() == pytest.approx(-1 / 3)


def test_clipping_hand_computed() -> None:
    # Ratios row 0 (0.5, 1.5, 1.0) with A = -1, row 1 (0.5, 1.5, 1.1) with A = +1, eps 0.2.
    # Row 0: 0.5 -> -min(-0.5, -0.8) = 0.8 (clipped low, gradient 0); 1.5 -> -min(-1.5, -1.2)
    #   = 1.5 (unclipped, d/dlogp = ratio = 1.5); 1.0 -> 1.0 (d/dlogp = 1.0).
    # Row 1: 0.5 -> -min(0.5, 0.8) = -0.5 (d/dlogp = -0.5); 1.5 -> -1.2 (clipped high,
    #   gradient 0); 1.1 -> -1.1 (d/dlogp = -1.1).
    # bnpo over 6 tokens: (0.8 + 1.5 + 1.0 - 0.5 - 1.2 - 1.1) / 6 = 0.5 / 6; gradients / 6.
    # Clip metrics: low = {row 0 ratio 0.5} = 1/6, high = {row 1 ratio 1.5} = 1/6, region 2/6.
    old = tensor([[-1.0, -2.0, -0.7], [-1.5, -0.3, -2.0]])
    ratios = tensor([[0.5, 1.5, 1.0], [0.5, 1.5, 1.1]])
    logp = old + ratios.log()
    mask = torch.ones(2, 3, dtype=torch.bool)
    out, grad = loss_and_grad(logp, old, tensor([-1.0, 1.0]), mask, loss_type="bnpo")
    assert out.loss.item() == pytest.approx(0.5 / 6)
    torch.testing.assert_close(grad, tensor([[0.0, 1.5, 1.0], [-0.5, 0.0, -1.1]]) / 6)
    assert float(out.metrics[LOW]) == pytest.approx(1 / 6)
    assert float(out.metrics[HIGH]) == pytest.approx(1 / 6)
    assert float(out.metrics[REGION]) == pytest.approx(2 / 6)
    assert KL not in out.metrics
    assert not out.metrics[LOW].requires_grad

    # Clip-higher: epsilon_high 0.6 leaves ratio 1.5 of row 1 unclipped: -1.5, d/dlogp = -1.5.
    out, grad = loss_and_grad(
        logp, old, tensor([-1.0, 1.0]), mask, loss_type="bnpo", epsilon_high=0.6
    )
    assert out.loss.item() == pytest.approx((0.8 + 1.5 + 1.0 - 0.5 - 1.5 - 1.1) / 6)
    assert float(grad[1, 1]) == pytest.approx(-1.5 / 6)
    assert float(out.metrics[HIGH]) == 0.0


def test_delta_caps_unclipped_ratio() -> None:
    # A = -1, ratio 1.5, eps 0.2, delta 1.4: -min(-min(1.5, 1.4), -1.2) = 1.4, and the cap is
    # flat, so the gradient is 0. Ratio 1.3 is under the cap: loss 1.3, d/dlogp = 1.3.
    # grpo over one row of 2 tokens: (1.4 + 1.3) / 2 = 1.35; gradients (0, 0.65).
    old = tensor([[-1.0, -2.0]])
    logp = old + tensor([[1.5, 1.3]]).log()
    mask = torch.ones(1, 2)
    kwargs = {"loss_type": "grpo", "delta": 1.4}
    out, grad = loss_and_grad(logp, old, tensor([-1.0]), mask, **kwargs)
    assert out.loss.item() == pytest.approx(1.35)
    torch.testing.assert_close(grad, tensor([[0.0, 0.65]]))
    # Without delta the loss is (1.5 + 1.3) / 2.
    out = compute(logp, old, tensor([-1.0]), mask, loss_type="grpo")
    assert out.loss.item() == pytest.approx(1.4)


def test_sequence_level_hand_computed() -> None:
    # Row 0: logp - old = (0.1, 0.3, pad) -> log s = 0.2, s = e^0.2 = 1.2214028, A = +1,
    #   epsilon_high 0.3 leaves it unclipped: per-token -1.2214028, d/dlogp_t = -s per token.
    # Row 1: logp - old = (-0.4, -0.6, -0.5) -> log s = -0.5, s = e^-0.5 = 0.6065307, A = -1,
    #   clipped low (< 0.8): per-token -min(-0.6065, -0.8) = 0.8, gradient 0.
    # bnpo over 5 active tokens: (2 * -1.2214028 + 3 * 0.8) / 5 = -0.00856110; grads -s / 5.
    # Clip metrics: low = 3 of 5 active tokens (all of row 1); high = 0.
    old = tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -1.5]])
    logp = old + tensor([[0.1, 0.3, 7.0], [-0.4, -0.6, -0.5]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    s = math.exp(0.2)
    out, grad = loss_and_grad(
        logp,
        old,
        tensor([1.0, -1.0]),
        mask,
        loss_type="bnpo",
        epsilon_high=0.3,
        importance_sampling_level="sequence",
    )
    assert out.loss.item() == pytest.approx((2 * -s + 3 * 0.8) / 5)
    torch.testing.assert_close(grad, tensor([[-s / 5, -s / 5, 0.0], [0.0, 0.0, 0.0]]))
    assert float(out.metrics[LOW]) == pytest.approx(3 / 5)
    assert float(out.metrics[HIGH]) == 0.0


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_sequence_level_gradient_equals_sequence_objective(loss_type: str) -> None:
    # GSPO-token keeps the value s_i and routes s_i * grad logp_t to each token. With one
    # advantage per sequence that is the gradient of the plain sequence objective, where s_i
    # depends on logp through the mean. Build that objective directly and compare.
    batch = random_batch(seed=4)
    logp, old, mask, adv = batch["logp"], batch["old"], batch["mask"], batch["adv"]
    kwargs = {"loss_type": loss_type, "max_completion_length": 6}
    _, grad = loss_and_grad(
        logp, old, adv, mask, importance_sampling_level="sequence", epsilon_high=0.28, **kwargs
    )
    leaf = logp.clone().requires_grad_(True)
    m = mask.to(F64)
    s = torch.exp(((leaf - old) * m).sum(-1) / m.sum(-1))[:, None].expand_as(leaf)
    clipped = s.clamp(0.8, 1.28)
    per_token = -torch.min(s * adv[:, None], clipped * adv[:, None]) * m
    reference = reduce(per_token, m, REGISTERED[loss_type].normaliser, StepCounts(None, None, 6))
    (want,) = torch.autograd.grad(reference, leaf)
    torch.testing.assert_close(grad, want)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_ratio_one_gives_reinforce_gradient(loss_type: str) -> None:
    # logp == old: no clipping is active, d loss / d logp = -A * mask / normaliser with the
    # normaliser of each aggregation.
    batch = random_batch(seed=1)
    logp, mask, adv = batch["logp"], batch["mask"], batch["adv"]
    m = mask.to(F64)
    b, t = logp.shape
    normaliser = {
        "grpo": b * m.sum(-1, keepdim=True),
        "bnpo": m.sum(),
        "dapo": torch.tensor(50.0, dtype=F64),
        "dr_grpo": torch.tensor(float(b * 9), dtype=F64),
    }[loss_type]
    out, grad = loss_and_grad(
        logp, None, adv, mask, loss_type=loss_type, num_active_tokens=50, max_completion_length=9
    )
    torch.testing.assert_close(grad, -adv[:, None] * m / normaliser)
    assert float(out.metrics[REGION]) == 0.0


def test_kl_penalty_hand_computed() -> None:
    # A = 0, ratio 1: only beta * k3 remains. ref - logp = ln 2 on both active tokens:
    # k3 = 2 - ln 2 - 1 = 0.3068528; the padded third token has NaN ref and is ignored.
    # bnpo: beta * 0.3068528 = 0.1 * 0.3068528; kl metric 0.3068528.
    # d/dlogp (beta k3) = beta (1 - e^{ref - logp}) = 0.1 * (1 - 2) = -0.1, over 2 tokens -> -0.05.
    logp = tensor([[-1.0, -2.0, -3.0]])
    ref = logp + math.log(2.0)
    ref[0, 2] = math.nan
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    k3_value = 2 - math.log(2.0) - 1
    out, grad = loss_and_grad(
        logp, None, tensor([0.0]), mask, loss_type="bnpo", beta=0.1, ref_logp=ref
    )
    assert out.loss.item() == pytest.approx(0.1 * k3_value)
    assert float(out.metrics[KL]) == pytest.approx(k3_value)
    torch.testing.assert_close(grad, tensor([[-0.05, -0.05, 0.0]]))
    # beta = 0 with ref_logp: the metric is reported, the loss has no penalty.
    out = compute(logp, None, tensor([0.0]), mask, loss_type="bnpo", ref_logp=ref)
    assert out.loss.item() == 0.0
    assert float(out.metrics[KL]) == pytest.approx(k3_value)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_padding_does_not_change_loss_or_gradient(loss_type: str, level: str) -> None:
    batch = random_batch(seed=2)
    logp, old, ref, mask, adv = (batch[k] for k in ("logp", "old", "ref", "mask", "adv"))
    b = logp.shape[0]
    garbage = tensor([[math.nan, math.inf, -math.inf, 1e30]] * b)
    pad = torch.zeros(b, 4, dtype=torch.bool)
    kwargs: dict[str, Any] = {
        "loss_type": loss_type,
        "importance_sampling_level": level,
        "beta": 0.04,
        "max_completion_length": 10,
        "epsilon_high": 0.28,
    }
    out, grad = loss_and_grad(logp, old, adv, mask, ref_logp=ref, **kwargs)
    out_pad, grad_pad = loss_and_grad(
        torch.cat([logp, garbage], 1),
        torch.cat([old, garbage.flip(1)], 1),
        adv,
        torch.cat([mask, pad], 1),
        ref_logp=torch.cat([ref, garbage], 1),
        **kwargs,
    )
    torch.testing.assert_close(out_pad.loss, out.loss)
    torch.testing.assert_close(grad_pad[:, :6], grad)
    assert (grad_pad[:, 6:] == 0).all()
    for name in (LOW, HIGH, REGION, KL):
        torch.testing.assert_close(out_pad.metrics[name], out.metrics[name])
    # Garbage inside the original mask-0 positions too (not only appended columns).
    inside = torch.where(mask, logp, torch.full_like(logp, math.nan))
    out_in, grad_in = loss_and_grad(inside, old, adv, mask, ref_logp=ref, **kwargs)
    torch.testing.assert_close(out_in.loss, out.loss)
    torch.testing.assert_close(grad_in, torch.where(mask, grad, torch.zeros_like(grad)))


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batches_sum_to_whole_batch(loss_type: str, level: str) -> None:
    batch = random_batch(b=6, seed=3)
    logp, old, ref, mask, adv = (batch[k] for k in ("logp", "old", "ref", "mask", "adv"))
    kwargs: dict[str, Any] = {
        "loss_type": loss_type,
        "importance_sampling_level": level,
        "beta": 0.04,
        "max_completion_length": 6,
        # Step-wide counts: the whole batch's active tokens and sequences.
        "num_active_tokens": int(mask.sum()),
        "num_sequences": 6,
    }
    whole, grad = loss_and_grad(logp, old, adv, mask, ref_logp=ref, **kwargs)
    leaf = logp.clone().requires_grad_(True)
    total = torch.zeros((), dtype=F64)
    for rows in (slice(0, 1), slice(1, 4), slice(4, 6)):  # unequal micro-batches
        total = (
            total
            + compute(
                leaf[rows], old[rows], adv[rows], mask[rows], ref_logp=ref[rows], **kwargs
            ).loss
        )
    (split_grad,) = torch.autograd.grad(total, leaf)
    torch.testing.assert_close(total, whole.loss)
    torch.testing.assert_close(split_grad, grad)


def test_dr_grpo_defaults_to_this_batch_size() -> None:
    # Without num_sequences, equal halves averaged equal the whole batch (gradient accumulation
    # dividing by the number of micro-batches).
    batch = random_batch(b=4, seed=5)
    logp, old, mask, adv = (batch[k] for k in ("logp", "old", "mask", "adv"))
    kwargs: dict[str, Any] = {"loss_type": "dr_grpo", "max_completion_length": 6}
    whole = compute(logp, old, adv, mask, **kwargs).loss
    halves = [
        compute(logp[r], old[r], adv[r], mask[r], **kwargs).loss for r in (slice(0, 2), slice(2, 4))
    ]
    torch.testing.assert_close((halves[0] + halves[1]) / 2, whole)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gradcheck_float64(level: str, loss_type: str) -> None:
    batch = random_batch(b=3, t=4, seed=6)
    old, ref, mask, adv = (batch[k] for k in ("old", "ref", "mask", "adv"))
    logp = batch["logp"].clone().requires_grad_(True)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return compute(
            x,
            old,
            adv,
            mask,
            loss_type=loss_type,
            importance_sampling_level=level,
            beta=0.1,
            ref_logp=ref,
            max_completion_length=4,
            epsilon_high=0.28,
            delta=2.0,
        ).loss

    assert torch.autograd.gradcheck(fn, (logp,))


def test_old_logp_none_equals_detached_logp() -> None:
    batch = random_batch(seed=7)
    logp, mask, adv = batch["logp"], batch["mask"], batch["adv"]
    a = compute(logp, None, adv, mask, loss_type="grpo")
    b = compute(logp, logp.clone(), adv, mask, loss_type="grpo")
    torch.testing.assert_close(a.loss, b.loss)


def _call(**overrides: Any) -> LossOutput:
    args: dict[str, Any] = {
        "logp": torch.zeros(2, 3),
        "old_logp": torch.zeros(2, 3),
        "advantages": torch.zeros(2),
        "mask": torch.ones(2, 3),
        "loss_type": "grpo",
    }
    args.update(overrides)
    return compute(**args)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"loss_type": "ppo"}, "unknown loss_type 'ppo'"),
        ({"importance_sampling_level": "batch"}, "unknown importance_sampling_level 'batch'"),
        ({"loss_type": "dr_grpo"}, "dr_grpo' needs max_completion_length"),
        ({"epsilon_low": -0.1}, "epsilon_low must be >= 0"),
        ({"epsilon_high": -0.1}, "epsilon_high must be >= 0"),
        ({"delta": 1.2}, r"delta must be > 1 \+ epsilon_high"),
        ({"delta": 1.3, "epsilon_high": 0.3}, r"delta must be > 1 \+ epsilon_high"),
        ({"beta": 0.04}, "needs ref_logp"),
        ({"beta": -1.0}, "beta must be >= 0"),
        ({"old_logp": torch.zeros(2, 4)}, "old_logp has shape"),
        ({"mask": torch.ones(3, 3)}, "mask has shape"),
        ({"beta": 0.1, "ref_logp": torch.zeros(2)}, "ref_logp has shape"),
        ({"advantages": torch.zeros(2, 1)}, r"advantages must be \(B,\)"),
        ({"logp": torch.zeros(2, 3, 1)}, r"logp must be \(B, T\)"),
        ({"loss_type": "dapo", "num_active_tokens": 0}, "num_active_tokens must be > 0"),
        ({"num_sequences": 0}, "num_sequences must be >= 1"),
        ({"max_completion_length": 0}, "max_completion_length must be >= 1"),
    ],
)
def test_bad_arguments(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _call(**overrides)


def test_float32_and_bool_or_float_masks() -> None:
    batch = random_batch(seed=8)
    logp, old, mask, adv = (batch[k].float() for k in ("logp", "old", "mask", "adv"))
    as_bool = compute(logp, old, adv, mask.bool(), loss_type="bnpo")
    as_float = compute(logp, old, adv, mask, loss_type="bnpo")
    assert as_bool.loss.dtype == torch.float32
    torch.testing.assert_close(as_bool.loss, as_float.loss)


def test_cispo_hand_computed() -> None:
    # Row 0, A = +1, ratios (0.5, 3.0, 6.0); row 1, A = -1, ratios (0.2, 1.0, 7.0); cap 5.
    # Weights sg(min(w, 5)): (0.5, 3, 5) and (0.2, 1, 5). Per token -w * A * logp, so
    # d/dlogp = -w * A: (-0.5, -3, -5) and (0.2, 1, 5); dapo over 6 tokens divides by 6.
    # cispo_clip_ratio: weights above the cap with A > 0: the 6.0 only (7.0 has A < 0): 1/6.
    old = tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]])
    ratios = tensor([[0.5, 3.0, 6.0], [0.2, 1.0, 7.0]])
    logp = old + ratios.log()
    adv = tensor([1.0, -1.0])
    mask = torch.ones(2, 3)
    out, grad = loss_and_grad(logp, old, adv, mask, loss_type="cispo", epsilon_high=5.0)
    w = tensor([[0.5, 3.0, 5.0], [0.2, 1.0, 5.0]])
    assert out.loss.item() == pytest.approx(float(-(w * adv[:, None] * logp).sum() / 6))
    torch.testing.assert_close(grad, -w * adv[:, None] / 6)
    assert float(out.metrics["cispo_clip_ratio"]) == pytest.approx(1 / 6)


def test_sapo_hand_computed() -> None:
    # One row of two tokens, grpo-style mean over the row's 2 tokens.
    # A = +1 (tau_pos 1.0) on ratio 1.2: f = sigmoid(0.2) * 4, d/dlogp f = 4 sig (1 - sig) * r.
    # The second row has A = -1 (tau_neg 1.05) on ratio 0.8: f = sigmoid(-0.21) * 4 / 1.05.
    old = tensor([[-1.0], [-2.0]])
    ratios = tensor([[1.2], [0.8]])
    logp = old + ratios.log()
    adv = tensor([1.0, -1.0])
    out, grad = loss_and_grad(logp, old, adv, torch.ones(2, 1), loss_type="sapo")

    def sig(z: float) -> float:
        return 1 / (1 + math.exp(-z))

    s_pos, s_neg = sig(0.2), sig(1.05 * -0.2)
    f_pos, f_neg = 4 * s_pos, 4 * s_neg / 1.05
    # Loss: mean over the 2 rows of -f * A; gradient -A f'(r) r / 2.
    assert out.loss.item() == pytest.approx((-f_pos + f_neg) / 2)
    g_pos = 4 * s_pos * (1 - s_pos) * 1.2
    g_neg = 4 * s_neg * (1 - s_neg) * 0.8
    torch.testing.assert_close(grad, tensor([[-g_pos / 2], [g_neg / 2]]))
    gate = (4 * s_pos * (1 - s_pos) + 4 * s_neg * (1 - s_neg)) / 2
    assert float(out.metrics["sapo/gate_mean"]) == pytest.approx(gate)


NEW_LOSSES = {"cispo": {"epsilon_high": 5.0}, "sapo": {}}


@pytest.mark.parametrize("loss_type", sorted(NEW_LOSSES))
def test_new_losses_give_the_policy_gradient_on_policy(loss_type: str) -> None:
    # At ratio 1 CISPO's weight is 1 and SAPO's gate has slope 1: both are the plain policy
    # gradient -A M / normaliser (dapo's 50 step tokens for cispo, grpo's per-row mean for sapo).
    batch = random_batch(seed=1)
    logp, mask, adv = batch["logp"], batch["mask"], batch["adv"]
    m = mask.to(F64)
    normaliser = {
        "cispo": torch.tensor(50.0, dtype=F64),
        "sapo": logp.shape[0] * m.sum(-1)[:, None],
    }
    _, grad = loss_and_grad(
        logp, None, adv, mask, loss_type=loss_type, num_active_tokens=50, **NEW_LOSSES[loss_type]
    )
    torch.testing.assert_close(grad, -adv[:, None] * m / normaliser[loss_type])


@pytest.mark.parametrize("loss_type", sorted(NEW_LOSSES))
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_new_losses_padding_and_gradcheck(loss_type: str, level: str) -> None:
    batch = random_batch(b=3, t=4, seed=9)
    logp, old, ref, mask, adv = (batch[k] for k in ("logp", "old", "ref", "mask", "adv"))
    kwargs: dict[str, Any] = {
        "loss_type": loss_type,
        "importance_sampling_level": level,
        "beta": 0.1,
        "ref_logp": ref,
        **NEW_LOSSES[loss_type],
    }
    out, grad = loss_and_grad(logp, old, adv, mask, **kwargs)
    inside = torch.where(mask, logp, torch.full_like(logp, math.nan))
    out_in, grad_in = loss_and_grad(inside, old, adv, mask, **kwargs)
    torch.testing.assert_close(out_in.loss, out.loss)
    torch.testing.assert_close(grad_in, torch.where(mask, grad, torch.zeros_like(grad)))
    if loss_type == "cispo":  # its stop-gradient makes the analytic gradient differ on purpose
        return
    leaf = logp.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: compute(x, old, adv, mask, **kwargs).loss, (leaf,))


@pytest.mark.parametrize("epsilon_high", [None, 0.28, 1.0])
def test_cispo_needs_a_cap_above_one(epsilon_high: float | None) -> None:
    with pytest.raises(ValueError, match="cispo' caps the importance weight"):
        LossSettings(loss_type="cispo", epsilon_high=epsilon_high)


def test_every_registered_loss_type_is_a_config_choice() -> None:
    from typing import get_args

    from grpokit.core.losses import LossTypeName

    assert set(get_args(LossTypeName)) == set(REGISTERED)


@pytest.mark.parametrize(
    ("mode", "weights", "affected"),
    [
        # Token ratios pi_old / pi_sampler = (2, 0.5, 4), clip_max 3.
        ("token_truncate", [2.0, 0.5, 3.0], 1 / 3),
        ("token_mask", [2.0, 0.5, 0.0], 1 / 3),
        # Their product 4 is above 3 for every token of the sequence.
        ("sequence_truncate", [3.0, 3.0, 3.0], 1.0),
        ("sequence_mask", [0.0, 0.0, 0.0], 1.0),
    ],
)
def test_mismatch_correction_hand_computed(
    mode: str, weights: list[float], affected: float
) -> None:
    # On-policy for the trainer (ratio 1, so the clipped term is -A = -1 per token), but the
    # sampler gave the tokens log-probs old - ln r. bnpo over 3 tokens: loss -sum(w) / 3,
    # d/dlogp = -w / 3. The KL term (beta 0.5, ref = logp + ln 2: k3 = 2 - ln 2 - 1) is added
    # unweighted: + 0.5 * k3, gradient 0.5 * (1 - 2) / 3 per token.
    logp = tensor([[-1.0, -2.0, -0.5]])
    ratios = tensor([[2.0, 0.5, 4.0]])
    sampler = logp - ratios.log()
    ref = logp + math.log(2.0)
    correction = MismatchCorrection(mode=mode, clip_max=3.0)  # type: ignore[arg-type]
    leaf = logp.clone().requires_grad_(True)
    out = policy_loss(
        LossInputs(leaf, None, tensor([1.0]), torch.ones(1, 3), ref, sampler_logp=sampler),
        LossSettings(loss_type="bnpo", beta=0.5, mismatch=correction),
    )
    (grad,) = torch.autograd.grad(out.loss, leaf)
    w = tensor([weights])
    k3_value = 2 - math.log(2.0) - 1
    assert out.loss.item() == pytest.approx(float(-w.sum() / 3 + 0.5 * k3_value))
    torch.testing.assert_close(grad, -w / 3 + 0.5 * (1 - 2) / 3)
    kind = "truncated" if mode.endswith("truncate") else "masked"
    assert float(out.metrics[f"mismatch/{kind}_frac"]) == pytest.approx(affected)
    # The gap: the k3 estimate of KL(sampler || trainer), r - ln r - 1 averaged over tokens.
    gap = sum(r - math.log(r) - 1 for r in (2.0, 0.5, 4.0)) / 3
    assert float(out.metrics["mismatch/kl"]) == pytest.approx(gap)
    assert float(out.metrics["mismatch/max_ratio"]) == pytest.approx(4.0)


def test_mismatch_is_measured_without_changing_the_loss_when_not_corrected() -> None:
    batch = random_batch(seed=11)
    logp, mask, adv = batch["logp"], batch["mask"], batch["adv"]
    sampler = logp + 0.1 * torch.randn(
        logp.shape, generator=torch.Generator().manual_seed(1), dtype=F64
    )
    plain = compute(logp, None, adv, mask, loss_type="dapo")
    measured = policy_loss(
        LossInputs(logp, None, adv, mask, sampler_logp=sampler), LossSettings(loss_type="dapo")
    )
    torch.testing.assert_close(measured.loss, plain.loss)
    assert float(measured.metrics["mismatch/kl"]) > 0
    assert "mismatch/masked_frac" not in measured.metrics


def test_truncated_sampling_keeps_the_kl_on_the_full_log_probs() -> None:
    """logp scores the truncated distribution (0.5 / 0.8 with kept mass S = 0.8), kl_logp the
    full one (0.4): the KL compares 0.4 with the reference's 0.2 (k3 = 0.5 - ln 0.5 - 1), and S is
    logged; padding (mask 0) counts in neither."""
    logp = torch.tensor([[math.log(0.5), 7.0]], requires_grad=True)
    kl_logp = torch.tensor([[math.log(0.4), -3.0]])
    ref = torch.tensor([[math.log(0.2), 0.0]])
    mask = torch.tensor([[1.0, 0.0]])
    x = LossInputs(logp, None, torch.tensor([1.0]), mask, ref, kl_logp=kl_logp)
    out = policy_loss(x, LossSettings(beta=0.1, loss_type="bnpo"))
    k3_want = 0.5 - math.log(0.5) - 1
    assert float(out.metrics["kl"]) == pytest.approx(k3_want, rel=1e-6)
    assert float(out.metrics["sampling/kept_mass"]) == pytest.approx(0.8, rel=1e-6)
    # the policy term -A * ratio (1 in value) plus beta * k3
    assert float(out.loss) == pytest.approx(-1.0 + 0.1 * k3_want, rel=1e-6)
    plain = policy_loss(x.__class__(logp, None, torch.tensor([1.0]), mask, ref), LossSettings())
    assert "sampling/kept_mass" not in plain.metrics


# ---- off-policy stabilisers (DeepSeek-V3.2; TRL off_policy_mask_threshold, use_bias_correction_kl)


def test_off_policy_mask_drops_negative_advantages_that_drifted_hand_computed() -> None:
    """logp -1 everywhere; the sampler's log-probs give mean log-ratios sampler - logp of
    (0.75, 0.75, 0.5, -0.5): row 0 has A > 0 (kept), row 1 A < 0 above 0.5 (dropped), row 2 A < 0
    at 0.5 exactly (kept: <=), row 3 below. dapo, ratio 1: per-token -A, so
    loss = (2 * -1 + 0 + 2 * 0.5 + 2 * 0.25) / 8 tokens = -0.0625 (unmasked: +0.1875)."""
    logp = torch.full((4, 2), -1.0, dtype=F64, requires_grad=True)
    sampler = tensor([[-0.5, 0.0], [-0.5, 0.0], [-0.5, -0.5], [-1.25, -1.75]])
    adv = tensor([1.0, -1.0, -0.5, -0.25])
    mask = torch.ones(4, 2)
    x = LossInputs(logp, None, adv, mask, sampler_logp=sampler)
    out = policy_loss(x, LossSettings(loss_type="dapo", off_policy_mask_threshold=0.5))
    assert float(out.loss) == pytest.approx(-0.0625)
    assert float(out.metrics["off_policy_mask/masked_frac"]) == pytest.approx(0.25)
    (grad,) = torch.autograd.grad(out.loss, logp)
    # d/dlogp of -A * exp(logp - sg(logp)) / 8 = -A / 8 on kept rows, 0 on the dropped one
    want = tensor([[-1 / 8] * 2, [0.0] * 2, [0.5 / 8] * 2, [0.25 / 8] * 2])
    torch.testing.assert_close(grad, want)
    off = policy_loss(x, LossSettings(loss_type="dapo"))
    assert float(off.loss) == pytest.approx(0.1875)
    assert "off_policy_mask/masked_frac" not in off.metrics


def test_off_policy_mask_uses_pi_old_without_the_samplers_log_probs_and_ignores_padding() -> None:
    """No sampler log-probs: the drift is old - logp. Both rows have A = -1 and one real token.
    Row 0: old -0.25, logp -1, drift 0.75 > 0.5: dropped (its padding, NaN and a huge drift,
    counts nowhere). Row 1: old -0.75, drift 0.25: kept; its ratio exp(-0.25) = 0.78 is below
    1 - epsilon = 0.8, so its term is -min(w A, 0.8 A) = 0.8. bnpo over 2 tokens: 0.4 (unmasked,
    row 0 clipped the same way: 0.8)."""
    logp = tensor([[-1.0, float("nan")], [-1.0, 0.0]])
    old = tensor([[-0.25, 50.0], [-0.75, 0.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    adv = tensor([-1.0, -1.0])
    x = LossInputs(logp, old, adv, mask)
    out = policy_loss(x, LossSettings(loss_type="bnpo", off_policy_mask_threshold=0.5))
    assert float(out.loss) == pytest.approx(0.4)
    assert float(out.metrics["off_policy_mask/masked_frac"]) == pytest.approx(0.5)
    assert float(policy_loss(x, LossSettings(loss_type="bnpo")).loss) == pytest.approx(0.8)


def test_off_policy_mask_threshold_must_be_a_non_negative_log_ratio() -> None:
    with pytest.raises(ValueError, match="off_policy_mask_threshold"):
        LossSettings(off_policy_mask_threshold=-0.1)


def test_bias_corrected_kl_hand_computed() -> None:
    """One token: pi_theta 0.5, pi_old 0.25 (w = 2), pi_ref 0.25 (r = ref / theta = 0.5), A = 0,
    beta 0.1. k3 = 0.5 - ln 0.5 - 1 = ln 2 - 0.5. Corrected: loss beta w k3 and gradient
    beta w (logp - ref) = 0.1 * 2 * ln 2; plain: beta k3 and beta (1 - r) = 0.05."""
    logp = tensor([[math.log(0.5)]])
    old, ref = tensor([[math.log(0.25)]]), tensor([[math.log(0.25)]])
    k3_value = math.log(2) - 0.5
    args = (old, tensor([0.0]), torch.ones(1, 1))
    out, grad = loss_and_grad(logp, *args, ref_logp=ref, beta=0.1, use_bias_correction_kl=True)
    assert float(out.loss) == pytest.approx(0.1 * 2 * k3_value)
    assert float(out.metrics[KL]) == pytest.approx(2 * k3_value)
    assert float(grad) == pytest.approx(0.1 * 2 * math.log(2))
    plain, plain_grad = loss_and_grad(logp, *args, ref_logp=ref, beta=0.1)
    assert float(plain.loss) == pytest.approx(0.1 * k3_value)
    assert float(plain_grad) == pytest.approx(0.1 * 0.5)


def test_bias_corrected_kl_on_policy_same_value_true_kl_gradient() -> None:
    """On-policy (old = None, w = 1 in value) the KL's value is unchanged, its gradient becomes
    beta (logp - ref) per token (here 0.1 * ln 2 over 1 token) instead of beta (1 - r)."""
    logp = tensor([[math.log(0.5)]])
    ref = tensor([[math.log(0.25)]])
    args = (None, tensor([0.0]), torch.ones(1, 1))
    out, grad = loss_and_grad(logp, *args, ref_logp=ref, beta=0.1, use_bias_correction_kl=True)
    plain, plain_grad = loss_and_grad(logp, *args, ref_logp=ref, beta=0.1)
    assert float(out.loss) == pytest.approx(float(plain.loss))
    assert float(grad) == pytest.approx(0.1 * math.log(2))
    assert float(plain_grad) == pytest.approx(0.05)


def test_off_policy_mask_reads_a_token_the_sampler_could_not_score_as_no_drift() -> None:
    """Sampler log-probs (NaN, -0.25) against logp -1: drifts (0, 0.75), mean 0.375 <= 0.5, kept;
    a NaN left in would make the mean NaN and drop the completion on one unscored token."""
    logp = torch.full((1, 2), -1.0, dtype=F64)
    sampler = tensor([[float("nan"), -0.25]])
    x = LossInputs(logp, None, tensor([-1.0]), torch.ones(1, 2), sampler_logp=sampler)
    out = policy_loss(x, LossSettings(loss_type="bnpo", off_policy_mask_threshold=0.5))
    assert float(out.metrics["off_policy_mask/masked_frac"]) == 0.0
    assert float(out.loss) == pytest.approx(1.0)
