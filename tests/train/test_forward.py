"""The training forward: encoding each distinct prompt once gives the log-probs and gradients of
the plain [prompt | completion] pass; projecting a chunk of positions at a time gives those of
projecting them all at once, without keeping the logits; bfloat16 compute agrees with float32 to a
stated tolerance and gives an importance ratio of exactly 1 on unchanged weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from grpokit.core.losses import LossInputs, LossSettings, policy_loss
from grpokit.core.truncation import truncate_logits
from grpokit.errors import UserError
from grpokit.models.loading import LoraSettings, Policy, load_policy
from grpokit.models.onednn import onednn_available, set_compute_dtype
from grpokit.train.forward import completion_logprobs, completion_scores, pack

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


def _lora_or_full(model_dir: Path, lora: bool) -> torch.nn.Module:
    """The policy model, with a non-zero random adapter under LoRA (so its gradients are not
    trivially zero)."""
    settings = LoraSettings(r=4, alpha=8.0) if lora else None
    model = load_policy(str(model_dir), lora=settings, need_reference=False).model
    if lora:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.3, generator=gen)
    return model


@pytest.mark.parametrize("share", [True, False], ids=["shared-prompts", "plain"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_projection_equals_projecting_all_positions(
    tiny_model_factory: Callable[..., Path],
    float64: Callable[[Any], Any],
    lora: bool,
    tied: bool,
    share: bool,
    temperature: float,
) -> None:
    """An identity (the same function of every position, evaluated in chunks), checked in float64:
    log-probs, entropies and every gradient agree to 1e-10 (measured below 1e-13)."""
    model_dir = tiny_model_factory(seed=2, initializer_range=0.3, tie_word_embeddings=tied)
    model = float64(_lora_or_full(model_dir, lora))
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    mask = batch.completion_mask.double()
    weights = torch.arange(1, mask.numel() + 1, dtype=torch.float64).view_as(mask)
    results = []
    # 5 positions a chunk: chunks cross rows, and the last one is short (7 x 6 = 42 positions).
    for chunk in (0, 5):
        model.zero_grad()
        logp, entropy = completion_logprobs(
            model,
            batch,
            temperature=temperature,
            with_entropy=True,
            share_prompts=share,
            logprob_chunk_size=chunk,
        )
        assert logp.dtype == torch.float64 and entropy is not None
        (logp * weights * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach() * mask, entropy * mask, grads))
    (lp_all, ent_all, g_all), (lp_chunked, ent_chunked, g_chunked) = results
    torch.testing.assert_close(lp_chunked, lp_all, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent_chunked, ent_all, rtol=0, atol=1e-10)
    assert g_all.keys() == g_chunked.keys() and len(g_all) > 0
    assert any("lm_head" in n or "embed_tokens" in n for n in g_all) != lora  # the head learns
    for name in g_all:
        error = float((g_chunked[name] - g_all[name]).norm() / g_all[name].norm())
        assert error < 1e-10, (name, error)


def test_chunked_projection_keeps_no_logits_for_the_backward(
    tiny_model_factory: Callable[..., Path],
) -> None:
    """Autograd keeps no tensor as large as the micro-batch's logits when chunked, and does keep
    one when all positions are projected at once (the memory the chunks save): (B x (C - 1) x V)
    with shared prompts, whose continuation pass projects C - 1 positions."""
    model = _lora_or_full(tiny_model_factory(seed=2, initializer_range=0.3), lora=False)
    gen = torch.Generator().manual_seed(0)
    completions = [torch.randint(3, 1000, (40,), generator=gen).tolist() for _ in range(4)]
    batch = pack(PROMPTS[:4], completions, PAD)
    logits_size = 4 * 39 * int(model.config.vocab_size)
    sizes: list[int] = []

    def pack_hook(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    for chunk, keeps_logits in ((0, True), (16, False)):
        sizes.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
            logp, _ = completion_logprobs(model, batch, logprob_chunk_size=chunk)
        assert (max(sizes) >= logits_size) == keeps_logits, (chunk, max(sizes), logits_size)
        logp.sum().backward()


class _ScaledLlama(LlamaForCausalLM):
    """A model whose forward changes the logits its head returns (as Gemma 2's soft-capping does)
    without a config field saying so."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 0.5
        return out


def test_chunking_refuses_a_forward_that_changes_the_logits(tiny_model_dir: Path) -> None:
    model = _ScaledLlama.from_pretrained(tiny_model_dir)
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    with pytest.raises(UserError, match="logprob_chunk_size: 0"):
        completion_logprobs(model, batch)
    logp, _ = completion_logprobs(model, batch, logprob_chunk_size=0)
    assert logp.shape == (len(PROMPTS), 6)
    model.config.logit_scale = 0.5  # a field naming the change (Cohere's): the plain path
    torch.testing.assert_close(completion_logprobs(model, batch)[0], logp, rtol=0, atol=0)


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
    # peft draws lora_A from the global generator: seeded here, so the weights (and how far
    # bfloat16 strays on them) do not depend on the tests run before (0.50 after another order).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
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


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_truncated_scores_on_every_path(
    tiny_model_factory: Callable[..., Path], float64: Callable[[Any], Any], lora: bool
) -> None:
    """top_k 20, top_p 0.9 at temperature 0.7, in float64: on every forward path (all positions
    projected at once, in chunks, prompts shared, packed) the log-probs are
    core.truncation's of the model's logits (the targets counted as kept), log S is the full
    log-prob less them, and the gradients of both agree with the plain path's."""
    model = float64(_lora_or_full(tiny_model_factory(seed=2, initializer_range=0.3), lora))
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    mask = batch.completion_mask.double()
    weights = torch.arange(1, mask.numel() + 1, dtype=torch.float64).view_as(mask)
    truncation = (20, 0.9)
    with torch.no_grad():
        logits = (
            model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
            ).logits[:, batch.prompt_length - 1 : -1]
            / 0.7
        )
    kept = truncate_logits(logits, top_k=20, top_p=0.9, token_ids=batch.completion_ids)
    want = torch.log_softmax(kept, -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    full = torch.log_softmax(logits, -1).gather(-1, batch.completion_ids[..., None])[..., 0]
    assert float((full - want)[mask.bool()].max()) < -0.1  # the truncation removes mass
    paths = {
        "plain": {"logprob_chunk_size": 0, "share_prompts": False},
        "chunked": {"logprob_chunk_size": 5, "share_prompts": False},
        "shared-chunked": {"logprob_chunk_size": 5, "share_prompts": True},
        "packed": {"logprob_chunk_size": 5, "padding_free": True},
    }
    grads: dict[str, dict[str, torch.Tensor]] = {}
    for name, kwargs in paths.items():
        model.zero_grad()
        logp, entropy, log_kept = completion_scores(
            model, batch, temperature=0.7, with_entropy=True, truncation=truncation, **kwargs
        )
        assert log_kept is not None and entropy is not None
        torch.testing.assert_close(logp * mask, want * mask, rtol=0, atol=1e-10)
        torch.testing.assert_close(log_kept * mask, (full - want) * mask, rtol=0, atol=1e-10)
        ((logp * weights + (logp + log_kept) * weights.flip(-1)) * mask).sum().backward()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for name, got in grads.items():
        assert got.keys() == grads["plain"].keys() and len(got) > 0
        for param, g in got.items():
            error = float((g - grads["plain"][param]).norm() / grads["plain"][param].norm())
            assert error < 1e-10, (name, param, error)
    untruncated = completion_scores(model, batch, temperature=0.7, truncation=(0, 1.0))
    assert untruncated[2] is None
