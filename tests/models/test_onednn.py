"""oneDNN linear layers: the same function (to float32 rounding) as torch's, forward and backward."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpokit.models.loading import LoraSettings, load_policy
from grpokit.models.onednn import (
    OneDNNLinear,
    PackedLinear,
    onednn_available,
    onednn_linear,
    onednn_training_pays,
    use_onednn_linears,
)

pytestmark = pytest.mark.skipif(
    not onednn_available(), reason="this PyTorch build has no oneDNN (mkldnn) linear ops"
)

# float32 products of length ~100 agree to a few ulps of their magnitude; accumulation order
# differs between the libraries, so exact equality is not expected.
TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.mark.parametrize("with_bias", [True, False])
def test_forward_and_backward_equal_torch(with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 96, generator=gen)  # 3-D input, as in a transformer
    weight = torch.randn(130, 96, generator=gen) / 10
    bias = torch.randn(130, generator=gen) if with_bias else None
    upstream = torch.randn(3, 7, 130, generator=gen)

    def grads(fn: object) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_(True) for t in (x, weight)]
        b = bias.clone().requires_grad_(True) if bias is not None else None
        out = fn(leaves[0], leaves[1], b)  # type: ignore[operator]
        (out * upstream).sum().backward()
        got = [out.detach(), leaves[0].grad, leaves[1].grad]
        if b is not None:
            got.append(b.grad)
        return tuple(t for t in got if t is not None)

    ours, theirs = grads(onednn_linear), grads(torch.nn.functional.linear)
    assert len(ours) == len(theirs) == (4 if with_bias else 3)
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, **TOL)


def test_frozen_weight_gets_no_gradient_and_other_dtypes_fall_back() -> None:
    x = torch.randn(5, 16, requires_grad=True)
    weight = torch.randn(8, 16)  # frozen, as a LoRA base layer
    onednn_linear(x, weight).sum().backward()
    assert x.grad is not None and weight.grad is None
    torch.testing.assert_close(x.grad, weight.sum(0).expand(5, 16), **TOL)
    # float64 is not oneDNN's: exactly torch's result
    x64, w64 = torch.randn(4, 16, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64)
    assert torch.equal(onednn_linear(x64, w64), torch.nn.functional.linear(x64, w64))


def test_packed_linear_equals_torch() -> None:
    layer = torch.nn.Linear(64, 200)
    x = torch.randn(2, 3, 64)
    assert PackedLinear.applies(layer)
    with torch.inference_mode():
        torch.testing.assert_close(PackedLinear(layer.weight, layer.bias)(x), layer(x), **TOL)
    assert not PackedLinear.applies(torch.nn.Linear(4, 4).double())


def test_model_keeps_its_state_and_function(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    plain = copy.deepcopy(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert use_onednn_linears(model, "torch") == 0
    assert use_onednn_linears(model, "onednn") == n_linear > 0
    assert all(isinstance(m, torch.nn.Linear) for m in model.modules() if type(m) is OneDNNLinear)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())

    ids = torch.tensor([[1, 50, 300, 7, 9000, 2]])
    for m in (model, plain):
        m.zero_grad()
        m(input_ids=ids, labels=ids).loss.backward()
    torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits, **TOL)
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    # a deep copy (the frozen reference model) keeps the class and computes alike
    twin = copy.deepcopy(model)
    assert sum(type(m) is OneDNNLinear for m in twin.modules()) == n_linear
    torch.testing.assert_close(twin(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("capability", ["AVX2", "AVX512"])
def test_auto_takes_it_for_training_only_on_cpus_with_avx512(
    monkeypatch: pytest.MonkeyPatch, capability: str
) -> None:
    # (the CPU's instruction set is outside what is tested: the rule that reads it is not)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert onednn_training_pays() == (capability == "AVX512")

    def layers() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    assert use_onednn_linears(layers()) == (2 if capability == "AVX512" else 0)
    assert use_onednn_linears(layers(), "onednn") == 2  # asked for by name: everywhere


def test_load_policy_uses_it_under_lora_and_full_fine_tuning(tiny_model_dir: Path) -> None:
    lora = load_policy(
        str(tiny_model_dir),
        lora=LoraSettings(r=4, alpha=8.0),
        need_reference=False,
        cpu_matmul="onednn",
    )
    names = {n for n, m in lora.model.named_modules() if type(m) is OneDNNLinear}
    assert any("lora_A" in n for n in names) and any("base_layer" in n for n in names)
    full = load_policy(str(tiny_model_dir), need_reference=True, cpu_matmul="onednn")
    assert full.reference is not None
    assert any(type(m) is OneDNNLinear for m in full.reference.modules())
    kept = load_policy(str(tiny_model_dir), need_reference=False, cpu_matmul="torch")
    assert not any(type(m) is OneDNNLinear for m in kept.model.modules())
