"""Padding-free packing (training.padding_free): one row per micro-batch, the sequences end to end
with position ids starting again for each, gives the log-probs, entropies, gradients and updates
of the padded layout; an attention that would mix the packed sequences is refused."""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from float64_identity import UPDATE_SETTINGS, assert_same_update, updated
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpokit.config import GRPOKitConfig
from grpokit.core.losses import LossTypeName
from grpokit.errors import UserError
from grpokit.models.loading import LoraSettings, load_policy
from grpokit.train.forward import completion_logprobs, pack
from grpokit.train.rollout_record import Rollout
from grpokit.train.trainer import GRPOTrainer

PAD = 2
# Two groups of 3 (prompts of different lengths) and a row with a prompt of its own; completions
# of different lengths, one of length 1 and one empty: padding everywhere in the padded layout.
PROMPTS = [[1, 50, 60, 70, 80]] * 3 + [[9, 400]] * 3 + [[11, 12, 13]]
COMPLETIONS = [[5, 6, 7, 8], [900], [44, 45], [3, 3, 3, 3, 3, 3], [], [70, 71, 72], [8, 9]]


def _model(model_dir: Path, lora: bool) -> torch.nn.Module:
    """The policy model, with a non-zero random adapter under LoRA (so its gradients are not
    trivially zero)."""
    settings = LoraSettings(r=4, alpha=8.0) if lora else None
    model = load_policy(str(model_dir), lora=settings, need_reference=False).model
    _randomise_adapter(model)
    return model


def _randomise_adapter(model: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.3)


@pytest.mark.parametrize("chunk", [0, 5], ids=["all-positions", "chunks-of-5"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_packed_forward_equals_padded_forward(
    tiny_model_factory: Callable[..., Path],
    float64: Callable[[Any], Any],
    lora: bool,
    chunk: int,
) -> None:
    """An identity (each token attends to the same tokens at the same positions), checked in
    float64 against both padded paths: plain rows, and prompts encoded once per group."""
    model = float64(_model(tiny_model_factory(seed=2, initializer_range=0.3), lora))
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    mask = batch.completion_mask.double()
    weights = torch.arange(1, mask.numel() + 1, dtype=torch.float64).view_as(mask)
    results = []
    for layout in ("packed", "plain", "shared-prompts"):
        model.zero_grad()
        logp, entropy = completion_logprobs(
            model,
            batch,
            temperature=0.7,
            with_entropy=True,
            share_prompts=layout == "shared-prompts",
            logprob_chunk_size=chunk,
            padding_free=layout == "packed",
        )
        assert logp.shape == (len(PROMPTS), 6) and entropy is not None
        (logp * weights * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach() * mask, entropy * mask, grads))
    (lp_packed, ent_packed, g_packed), *padded = results
    for lp, ent, grads in padded:
        torch.testing.assert_close(lp_packed, lp, rtol=0, atol=1e-10)
        torch.testing.assert_close(ent_packed, ent, rtol=0, atol=1e-10)
        assert grads.keys() == g_packed.keys() and len(grads) > 0
        for name in grads:
            error = float((g_packed[name] - grads[name]).norm() / grads[name].norm())
            assert error < 1e-10, (name, error)


def _experience() -> Rollout:
    """8 completions of lengths 2-30 for two prompts, tool messages inside some of them."""
    g = torch.Generator().manual_seed(3)
    lengths = [2, 3, 12, 1, 4, 4, 30, 2]
    prompts = [[1, 9690, 198, 2683, 314], [1, 4093, 30]]
    tool_mask = [[1] * n for n in lengths]
    tool_mask[2][3:7] = [0] * 4  # a tool result inside the completion
    tool_mask[6][10:25] = [0] * 15
    return Rollout(
        prompt_ids=[prompts[i // 4] for i in range(len(lengths))],
        completion_ids=[torch.randint(3, 20000, (k,), generator=g).tolist() for k in lengths],
        advantages=torch.randn(len(lengths), generator=g),
        loss_mask_rows=torch.tensor([1.0, 1, 1, 1, 1, 1, 0, 1]),  # one truncated row masked out
        tool_mask=tool_mask,
    )


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("loss_type", typing.get_args(LossTypeName))
def test_packed_update_equals_padded_update(
    make_config: Callable[..., GRPOKitConfig],
    float64: Callable[[GRPOTrainer], GRPOTrainer],
    loss_type: str,
    lora: bool,
) -> None:
    """Two optimizer steps on one batch (old log-probs, a KL to the reference, a tool mask, a
    masked row), in float64: the weights and the step's metrics agree to 1e-9."""
    exp = _experience()
    after = []
    for padding_free in (False, True):
        config = make_config(
            model={"lora": {"r": 4, "alpha": 8}} if lora else None,
            **UPDATE_SETTINGS,
            loss_type=loss_type,
            # cispo caps the weight at epsilon_high, which it needs set (ScaleRL's 5)
            epsilon_high=5.0 if loss_type == "cispo" else None,
            padding_free=padding_free,
        )
        config.training.output_dir = f"run-{padding_free}"
        trainer = float64(GRPOTrainer(config, progress=False, log=lambda m: None))
        _randomise_adapter(trainer.policy.model)
        after.append(updated(trainer, exp))
    assert any(trainer.policy.model.get_parameter(n).requires_grad for n in after[0][0])
    assert_same_update(*after, keys=("loss", "grad_norm", "kl", "entropy"))


def _attention_without_mask(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """sdpa with the mask dropped: causal over the whole row, as a kernel that takes no mask."""
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


def test_attention_that_mixes_packed_sequences_is_refused(tiny_model_dir: Path) -> None:
    # transformers builds no mask for an implementation registered without a mask function.
    AttentionInterface.register("grpokit_test_no_mask", _attention_without_mask)
    model = load_policy(str(tiny_model_dir), need_reference=False).model
    batch = pack(PROMPTS, COMPLETIONS, PAD)
    model.set_attn_implementation("grpokit_test_no_mask")
    with pytest.raises(UserError, match=r"training.padding_free: false") as caught:
        completion_logprobs(model, batch, padding_free=True)
    assert "attend to the one before it" in str(caught.value)
    logp, _ = completion_logprobs(model, batch)  # padded rows still work with it
    assert logp.shape == (len(PROMPTS), 6)
    model.set_attn_implementation("sdpa")
    packed, _ = completion_logprobs(model, batch, padding_free=True)
    torch.testing.assert_close(
        packed * batch.completion_mask,
        completion_logprobs(model, batch)[0] * batch.completion_mask,
        rtol=1e-4,
        atol=1e-5,
    )


def test_packing_needs_a_prompt_token_in_every_row(tiny_model_dir: Path) -> None:
    model = load_policy(str(tiny_model_dir), need_reference=False).model
    batch = pack([[1, 2], []], [[5, 6], [7, 8]], PAD)
    with pytest.raises(ValueError, match="at least one token"):
        completion_logprobs(model, batch, padding_free=True)
