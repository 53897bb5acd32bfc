"""The training forward: encoding each distinct prompt once gives the log-probs and gradients of
the plain [prompt | completion] pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpokit.models.loading import LoraSettings, load_policy
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
