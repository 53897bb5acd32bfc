"""The training forward: encoding each distinct prompt once gives the log-probs and gradients of
the plain [prompt | completion] pass; bfloat16 compute agrees with float32 to a stated tolerance
and gives an importance ratio of exactly 1 on unchanged weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpokit.core.losses import LossInputs, LossSettings, policy_loss
from grpokit.models.loading import LoraSettings, Policy, load_policy
from grpokit.models.onednn import onednn_available, set_compute_dtype
from grpokit.train.forward import completion_logprobs, pack

PAD = 2
# Two groups of 3 (prompts of different lengths, so left padding is exercised) and a row with a
# prompt of its own; completions of different lengths, one of length 1 and one empty.
PROMPTS = [[1, 50, 60, 70, 80]] * 3 + [[9, 400]] * 3 + [[11, 12, 13]]
COMPLETIONS = [[5, 6, 7, 8], [900], [44, 45], [3, 3, 3, 3, 3, 3], [], [70, 71, 72], [8, 9]]


def test_pack_finds_the_distinct_prompts() -> None:
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    assert batch.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2]
    assert batch.prompt_rows.tolist() == [0, 3, 6]
    assert batch.shares_prompts
    assert not pack(PROMPTS[:1], COMPLETIONS[:1], PAD).shares_prompts
    assert batch.prompt_length == 5 and batch.completion_length == 6


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompt_forward_equals_plain_forward(
    tiny_model_factory: object, lora: bool, temperature: float
) -> None:
    model_dir: Path = tiny_model_factory(seed=2, initializer_range=0.3)  # type: ignore[operator]
    settings = LoraSettings(r=4, alpha=8.0) if lora else None
    policy = load_policy(str(model_dir), lora=settings, need_reference=False)
    model = policy.model
    if lora:  # a non-zero adapter, so its gradients are not trivially zero
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.3)
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    mask = batch.completion_mask
    results = []
    for share in (True, False):
        model.zero_grad()
        logp, entropy = completion_logprobs(
            model, batch, temperature=temperature, with_entropy=True, share_prompts=share
        )
        # a loss that weighs every position differently, so a misplaced token would show
        weights = torch.arange(1, logp.numel() + 1, dtype=torch.float32).view_as(logp)
        (logp * weights * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        assert entropy is not None
        results.append((logp.detach() * mask, entropy * mask, grads))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    assert lp_a.shape == (len(PROMPTS), 6)
    torch.testing.assert_close(lp_a, lp_b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ent_a, ent_b, rtol=1e-4, atol=1e-5)
    assert g_a.keys() == g_b.keys() and len(g_a) > 0
    for name in g_a:
        # elementwise tolerances fail on entries near zero (float32 sums in another order)
        error = float((g_a[name] - g_b[name]).norm() / g_b[name].norm())
        assert error < 1e-4, (name, error)


def test_gradient_checkpointing_takes_the_plain_pass(tiny_model_dir: Path) -> None:
    policy = load_policy(str(tiny_model_dir), gradient_checkpointing=True, need_reference=False)
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    logp, _ = completion_logprobs(policy.model, batch)
    logp.sum().backward()  # a cache under checkpointing would have failed or been refused
    with torch.no_grad():
        policy.model.eval()
        want, _ = completion_logprobs(policy.model, batch, share_prompts=False)
    torch.testing.assert_close(logp.detach(), want, rtol=1e-4, atol=1e-5)


needs_bf16 = pytest.mark.skipif(
    not (onednn_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU or PyTorch build has no oneDNN bfloat16 kernels",
)

# Per-token log-probs of bfloat16 compute against float32 on the tiny model below (wide weights:
# logits of standard deviation about 2.4, larger activations than a trained model's): measured
# largest / mean differences 0.15 / 0.04 (full), 0.24 / 0.05 (with the random adapter). A
# bfloat16 activation keeps 8 significant bits; a wrong computation is off by whole units.
BF16_LOGP_MAX = 0.4
BF16_LOGP_MEAN = 0.08


def _bf16_policy(model_dir: Path, lora: bool) -> Policy:
    """A float32 policy marked to compute in bfloat16 (as ``dtype: auto`` does on a CPU with
    native bf16; marked by hand so the test also runs where bf16 is emulated)."""
    settings = LoraSettings(r=4, alpha=8.0) if lora else None
    policy = load_policy(str(model_dir), lora=settings, need_reference=False)
    if lora:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in policy.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.3, generator=gen)
    set_compute_dtype(policy.model, torch.bfloat16)
    return policy


@needs_bf16
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_bf16_logprobs_agree_with_float32_and_train_the_float32_weights(
    tiny_model_factory: object, lora: bool
) -> None:
    model_dir: Path = tiny_model_factory(seed=2, initializer_range=0.3)  # type: ignore[operator]
    model = _bf16_policy(model_dir, lora).model
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    mask = batch.completion_mask.bool()
    results = []
    for dtype in (torch.bfloat16, None):
        set_compute_dtype(model, dtype)
        model.zero_grad()
        logp, entropy = completion_logprobs(model, batch, temperature=0.7, with_entropy=True)
        (logp * batch.completion_mask).sum().backward()
        assert logp.dtype == torch.float32 and entropy is not None
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert grads and all(g.dtype == torch.float32 for g in grads.values())
        results.append((logp.detach(), {n: g.clone() for n, g in grads.items()}))
    (lp16, g16), (lp32, g32) = results
    assert not torch.equal(lp16, lp32)  # bfloat16 really ran
    diff = (lp16 - lp32).abs()[mask]
    assert float(diff.max()) < BF16_LOGP_MAX and float(diff.mean()) < BF16_LOGP_MEAN
    for name in g32:  # relative error of each gradient: measured at most 0.10
        error = float((g16[name] - g32[name]).norm() / g32[name].norm())
        assert error < 0.25, (name, error)


@needs_bf16
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("share", [True, False], ids=["shared-prompts", "plain"])
def test_bf16_old_and_new_logprobs_are_identical(
    tiny_model_factory: object, lora: bool, share: bool
) -> None:
    """pi_old (no gradient, before the update) and pi_theta (with gradient) on the same weights
    come from the same bfloat16 computation: the importance ratio is exactly 1, so nothing is
    clipped before the weights move."""
    model_dir: Path = tiny_model_factory(seed=2, initializer_range=0.3)  # type: ignore[operator]
    model = _bf16_policy(model_dir, lora).model
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    with torch.no_grad():
        old, _ = completion_logprobs(model, batch, temperature=0.7, share_prompts=share)
    new, _ = completion_logprobs(model, batch, temperature=0.7, share_prompts=share)
    assert new.requires_grad and torch.equal(new.detach(), old)
    advantages = torch.linspace(-1.0, 1.0, len(PROMPTS))
    out = policy_loss(
        LossInputs(new, old, advantages, batch.completion_mask),
        # a clip range far narrower than bfloat16's error on the log-probs
        LossSettings(loss_type="grpo", epsilon_low=1e-3, epsilon_high=1e-3),
    )
    assert float(out.metrics["clip_ratio/region_mean"]) == 0.0
