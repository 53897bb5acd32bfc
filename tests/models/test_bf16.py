"""bfloat16 compute on CPU: which machines get it, how a policy is marked, and that the bfloat16
linear layers compute the float32 product to bfloat16 rounding, with float32 gradients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpokit.models.loading import LoraSettings, load_policy
from grpokit.models.onednn import (
    OneDNNLinear,
    PackedLinear,
    _frozen_cast,
    bf16_compute_applies,
    compute_autocast,
    compute_dtype,
    cpu_bf16_native,
    frozen_casts_kept,
    onednn_available,
    onednn_linear,
    set_compute_dtype,
    store_frozen_linears_in_compute_dtype,
)

needs_bf16 = pytest.mark.skipif(
    not (onednn_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU or PyTorch build has no oneDNN bfloat16 kernels",
)

# A product of bfloat16-rounded inputs (8 significant bits each) accumulated in float32: about
# 2^-8 relative error per input, partly cancelling over the sum.
BF16_REL = 1e-2


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo to compare with")
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("/proc/cpuinfo lists no flags")


def test_native_bf16_follows_the_cpu_flags() -> None:
    flags = _cpuinfo_flags()
    assert cpu_bf16_native() == bool(flags & {"avx512_bf16", "amx_bf16"})


def test_bf16_compute_only_on_cpu_with_onednn() -> None:
    assert not bf16_compute_applies(torch.device("cuda"))
    assert not bf16_compute_applies(torch.device("cpu"), "torch")
    native = cpu_bf16_native() and onednn_available()
    assert bf16_compute_applies(torch.device("cpu")) == native
    assert bf16_compute_applies(torch.device("cpu"), "onednn") == native


@needs_bf16
def test_packed_bf16_linear_is_the_product_to_bf16_rounding() -> None:
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(96, 200)
    x = torch.randn(5, 96, generator=gen)
    with torch.inference_mode():
        packed = PackedLinear(layer.weight, layer.bias, dtype=torch.bfloat16)
        out = packed(x.bfloat16())
        want = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == want.shape
    assert _rel(out, want) < BF16_REL
    assert layer.weight.dtype == torch.float32  # the layer itself is untouched


@needs_bf16
def test_linear_under_autocast_computes_bf16_with_float32_gradients() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 64, generator=gen)
    weight = torch.randn(48, 64, generator=gen) / 8
    upstream = torch.randn(3, 7, 48, generator=gen)

    def run(autocast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xs, w = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = onednn_linear(xs, w)
        (out.float() * upstream).sum().backward()
        assert xs.grad is not None and w.grad is not None
        return out, xs.grad, w.grad

    out16, gx16, gw16 = run(True)
    out32, gx32, gw32 = run(False)
    assert out16.dtype == torch.bfloat16 and out32.dtype == torch.float32
    assert gw16.dtype == torch.float32  # the master weight's gradient stays float32
    for a, b in ((out16, out32), (gx16, gx32), (gw16, gw32)):
        assert _rel(a, b) < BF16_REL


def test_compute_autocast_follows_the_mark(tiny_model_dir: Path) -> None:
    policy = load_policy(str(tiny_model_dir), need_reference=False)  # float32: no mark
    model = policy.model
    assert compute_dtype(model) is None
    with compute_autocast(model):
        assert not torch.is_autocast_enabled("cpu")
    set_compute_dtype(model, torch.bfloat16)
    assert compute_dtype(model) == torch.bfloat16
    with compute_autocast(model):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_auto_dtype_keeps_float32_weights_and_marks_where_the_cpu_has_bf16(
    tiny_model_dir: Path, lora: bool
) -> None:
    settings = LoraSettings(r=2, alpha=4.0) if lora else None
    policy = load_policy(str(tiny_model_dir), dtype="auto", lora=settings, need_reference=True)
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    want = torch.bfloat16 if bf16_compute_applies(torch.device("cpu")) else torch.float32
    assert policy.compute_dtype == want
    with policy.reference_model() as reference:  # a copy, or the same network under LoRA
        assert compute_dtype(reference) == compute_dtype(policy.model)
    forced = load_policy(
        str(tiny_model_dir), dtype="auto", need_reference=False, cpu_matmul="torch"
    )
    assert forced.compute_dtype == torch.float32
    plain = load_policy(str(tiny_model_dir), dtype="float32", need_reference=False)
    assert plain.compute_dtype == torch.float32


@needs_bf16
def test_frozen_weights_are_cast_once_per_autocast_region() -> None:
    """A frozen weight (a LoRA base layer, a reference copy) is cast to bfloat16 once per
    compute_autocast region: every product in it saves the same copy for its backward (autocast
    alone would cast, and keep, one copy per product)."""
    layer = OneDNNLinear(16, 8, bias=False)
    layer.requires_grad_(False)
    set_compute_dtype(layer, torch.bfloat16)
    x = torch.randn(3, 16, requires_grad=True)
    saved: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        for _ in range(2):
            with compute_autocast(layer):
                first, second = layer(x), layer(x * 2)
            (first.float().sum() + second.float().sum()).backward()
    copies = [t for t in saved if t.dtype == torch.bfloat16 and t.shape == (16, 8)]  # W^T
    assert len(copies) == 4  # two products per region, two regions
    assert copies[0].data_ptr() == copies[1].data_ptr()  # one copy within a region
    assert x.grad is not None and layer.weight.grad is None
    torch.testing.assert_close(x.grad, 6 * layer.weight.sum(0).expand(3, 16), rtol=1e-2, atol=1e-2)


@needs_bf16
def test_kept_casts_serve_every_region_until_the_weight_changes() -> None:
    """Inside frozen_casts_kept(model), the model's own frozen weights are cast once for all
    compute_autocast regions (LoRA's reference, old and policy forwards); a weight changed in
    place is cast again; another model's frozen weights (a reference copy) still get one cast
    per region; outside the scope, one per region again; the next scope reuses the casts (LoRA's
    base is cast once per run)."""
    model = torch.nn.Sequential(OneDNNLinear(16, 8, bias=False))
    other = OneDNNLinear(16, 8, bias=False)
    for m in (model, other):
        m.requires_grad_(False)
        set_compute_dtype(m, torch.bfloat16)
    weight = model[0].weight
    x = torch.randn(3, 16)
    saved: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    def casts(module: torch.nn.Module, regions: int) -> list[int]:
        """The storage each region's product used for the cast weight."""
        saved.clear()
        x.requires_grad_(True)
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            for _ in range(regions):
                with compute_autocast(module):
                    module(x).float().sum().backward()
        return [t.data_ptr() for t in saved if t.dtype == torch.bfloat16 and t.shape == (16, 8)]

    with frozen_casts_kept(model):
        kept = casts(model, 3)
        assert len(kept) == 3 and len(set(kept)) == 1
        before = casts(model, 1)[0]
        with torch.no_grad():
            weight.add_(1.0)  # as merging an adapter into its base layer does
        changed = casts(model, 1)
        assert changed[0] != before
        assert len(set(casts(other, 2))) == 2  # not the scope's model: cast per region
        with compute_autocast(model):
            out = model(x).float()
        torch.testing.assert_close(out, x @ weight.t(), rtol=2e-2, atol=5e-2)  # the new weight
    assert len(set(casts(model, 2))) == 2  # the scope is gone
    with frozen_casts_kept(model):
        again = casts(model, 2)
    assert again == changed * 2  # the next scope starts with the last one's casts


@needs_bf16
def test_frozen_linears_stored_in_the_compute_dtype_compute_the_same_to_the_bit() -> None:
    model = torch.nn.Sequential(OneDNNLinear(16, 8), torch.nn.LayerNorm(8), OneDNNLinear(8, 4))
    assert store_frozen_linears_in_compute_dtype(model) == []  # no compute dtype: unchanged
    model[2].requires_grad_(False)
    set_compute_dtype(model, torch.bfloat16)
    x = torch.randn(5, 16)
    with compute_autocast(model):
        before = model(x)
    assert store_frozen_linears_in_compute_dtype(model) == ["2"]  # the frozen one only
    assert model[0].weight.dtype == torch.float32 and model[2].weight.dtype == torch.bfloat16
    assert model[1].weight.dtype == torch.float32 and model[2].bias.dtype == torch.float32
    with compute_autocast(model):
        assert torch.equal(model(x), before)


def _lora_forward_backward(
    policy: Any, ids: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits of the policy (under its compute dtype) and the LoRA gradients of a loss on them."""
    model = policy.model
    model.zero_grad(set_to_none=True)
    with compute_autocast(model):
        logits = model(input_ids=ids).logits.float()
    torch.log_softmax(logits, dim=-1)[..., 3].sum().backward()
    grads = [p.grad.clone() for p in policy.trainable_parameters()]
    return logits.detach(), grads


@needs_bf16
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied-head"])
def test_lora_base_narrowed_to_the_compute_dtype_trains_the_same_to_the_bit(
    tiny_model_factory: Any, tied: bool, tmp_path: Path
) -> None:
    """LoRA's frozen base stored in bfloat16 (Policy.narrow_frozen_base): the logits and the
    adapters' gradients equal those of float32 weights cast per forward to the bit, the float32
    base is gone, a tied head keeps its tie, and a merged save writes the float32 base again."""
    path = tiny_model_factory(seed=3, tie_word_embeddings=tied)
    policy = load_policy(str(path), lora=LoraSettings(r=2, alpha=4.0), need_reference=True)
    set_compute_dtype(policy.model, torch.bfloat16)
    for p in policy.trainable_parameters():  # peft starts B at zero; a gradient through A too
        torch.nn.init.normal_(p, std=0.1)
    policy.save(tmp_path / "before", merged=True)
    ids = torch.randint(0, 60, (2, 7))
    logits, grads = _lora_forward_backward(policy, ids)

    narrowed = policy.narrow_frozen_base()
    frozen = [p for p in policy.model.parameters() if not p.requires_grad]
    assert narrowed == len(policy.narrowed) > 0
    head = policy.model.get_output_embeddings()
    embedding = policy.model.get_input_embeddings()
    assert (head.weight is embedding.weight) is tied  # the tie kept
    assert embedding.weight.dtype == torch.float32
    assert head.weight.dtype == (torch.float32 if tied else torch.bfloat16)
    assert not any(
        p.dtype == torch.float32 and p.dim() == 2 for p in frozen if p is not embedding.weight
    )
    after_logits, after_grads = _lora_forward_backward(policy, ids)
    assert torch.equal(after_logits, logits)
    assert all(torch.equal(a, b) for a, b in zip(after_grads, grads, strict=True))

    policy.save(tmp_path / "after", merged=True)
    from safetensors.torch import load_file

    before = load_file(tmp_path / "before" / "model.safetensors")
    after = load_file(tmp_path / "after" / "model.safetensors")
    assert before.keys() == after.keys()
    assert all(after[k].dtype == torch.float32 and torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_kept_casts_are_not_kept_under_gradient_checkpointing(
    tiny_model_dir: Path, checkpointing: bool
) -> None:
    """With gradient checkpointing the backward recomputes with casts of its own: keeping the
    forward's casts for the update would only add a copy of the base model to the peak."""
    policy = load_policy(
        str(tiny_model_dir),
        lora=LoraSettings(r=2, alpha=4.0),
        need_reference=False,
        gradient_checkpointing=checkpointing,
    )
    model = policy.model  # in train mode, as in the update
    set_compute_dtype(model, torch.bfloat16)
    base = next(p for n, p in model.named_parameters() if n.endswith("q_proj.base_layer.weight"))
    with frozen_casts_kept(model):
        casts = []
        for _ in range(2):  # two regions, as the reference and the policy forward
            with compute_autocast(model):
                casts.append(_frozen_cast(base))
    assert (casts[0] is casts[1]) is not checkpointing
