from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from grpokit.errors import UserError
from grpokit.hub.embedded import EMBEDDED_MODEL
from grpokit.hub.resolve import load_tokenizer, resolve_model_path
from grpokit.models.compat import hf_model, is_checkpointing
from grpokit.models.loading import POLICY_FILE, LoraSettings, Policy, load_policy

PROMPT = torch.tensor([[1, 520, 3012, 314, 1875, 42, 7, 99]])
LORA = LoraSettings(r=4, alpha=8.0, dropout=0.0, target_modules="all-linear")


def logits_of(module: torch.nn.Module) -> torch.Tensor:
    was_training = module.training
    module.eval()
    with torch.no_grad():
        out = module(input_ids=PROMPT).logits
    module.train(was_training)
    return out


def perturb_lora(policy: Policy, seed: int) -> None:
    """Give the LoRA B matrices non-zero values so the adapter changes the output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)


def perturb_all(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)


# --- resolve_model_path / load_tokenizer -------------------------------------------------------


def test_resolve_embedded_name_gives_converted_dir(embedded_model_path: Path) -> None:
    assert resolve_model_path(EMBEDDED_MODEL) == str(embedded_model_path)
    assert resolve_model_path("SmolLM2-135M-Instruct") == str(embedded_model_path)


def test_resolve_local_dir_and_hub_name(tiny_model_dir: Path) -> None:
    assert resolve_model_path(str(tiny_model_dir)) == str(tiny_model_dir)
    assert resolve_model_path("HuggingFaceTB/SmolLM2-360M-Instruct") == (
        "HuggingFaceTB/SmolLM2-360M-Instruct"
    )


def test_resolve_bad_paths_raise_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope"))
    with pytest.raises(UserError, match="does not exist"):
        resolve_model_path("./models/missing")
    with pytest.raises(UserError, match="no config.json"):
        resolve_model_path(str(tmp_path))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(UserError, match="GGUF"):
        resolve_model_path(str(gguf))


def test_unreachable_hub_name_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    # The offline flag is read at import time; set the module's value so no network is tried.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match="no-such-owner/no-such-model"):
        load_policy("no-such-owner/no-such-model", need_reference=False)


def test_load_tokenizer_sets_missing_pad_token(tiny_model_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(str(tiny_model_dir))
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()).get("pad_token") is None
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded.pad_token == reloaded.eos_token == "<|im_end|>"
    assert reloaded.chat_template


# --- load_policy -------------------------------------------------------------------------------


def test_full_fine_tune_reference_is_a_frozen_copy(tiny_model_dir: Path) -> None:
    policy = load_policy(str(tiny_model_dir), need_reference=True)
    assert not policy.uses_adapter and policy.reference is not None
    assert policy.model.training and not policy.reference.training
    n_params = len(list(policy.model.parameters()))
    assert len(policy.trainable_parameters()) == n_params
    assert not any(p.requires_grad for p in policy.reference.parameters())
    before = logits_of(policy.model)
    perturb_all(policy.model, seed=1)
    with policy.reference_model() as ref:
        assert ref is policy.reference
        torch.testing.assert_close(logits_of(ref), before, rtol=0, atol=0)
    assert not torch.allclose(logits_of(policy.model), before)


def test_no_reference_raises(tiny_model_dir: Path) -> None:
    policy = load_policy(str(tiny_model_dir), need_reference=False)
    assert policy.reference is None
    with pytest.raises(RuntimeError, match="need_reference"), policy.reference_model():
        pass


def test_dtype_bfloat16(tiny_model_dir: Path) -> None:
    policy = load_policy(str(tiny_model_dir), dtype="bfloat16", need_reference=True)
    assert next(policy.model.parameters()).dtype == torch.bfloat16
    assert policy.reference is not None
    assert next(policy.reference.parameters()).dtype == torch.bfloat16


def test_lora_reference_is_adapter_disabled(tiny_model_dir: Path) -> None:
    base = logits_of(load_policy(str(tiny_model_dir), need_reference=False).model)
    policy = load_policy(str(tiny_model_dir), lora=LORA, need_reference=True)
    assert policy.uses_adapter and policy.reference is None
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert len(policy.trainable_parameters()) == len(names)
    perturb_lora(policy, seed=2)
    assert not torch.allclose(logits_of(policy.model), base, atol=1e-3)
    for _ in range(2):  # the second use runs on the layers found by the first
        with policy.reference_model() as ref:
            torch.testing.assert_close(logits_of(ref), base, rtol=1e-5, atol=1e-5)
            # as peft's disable_adapter() leaves it: every layer off, the adapter frozen
            assert policy.model.get_model_status().enabled is False
            assert not policy.model.has_active_enabled_adapter
            assert not any(p.requires_grad for p in policy.model.parameters())
        # the adapter is back on after the context, trainable again
        assert policy.model.get_model_status().enabled is True
        assert policy.model.has_active_enabled_adapter
        assert [n for n, p in policy.model.named_parameters() if p.requires_grad] == names
        assert not torch.allclose(logits_of(policy.model), base, atol=1e-3)


def test_lora_reference_leaves_a_layer_switched_off_before_it_off(tiny_model_dir: Path) -> None:
    from peft.tuners.tuners_utils import BaseTunerLayer

    policy = load_policy(str(tiny_model_dir), lora=LORA, need_reference=True)
    layers = [m for m in policy.model.modules() if isinstance(m, BaseTunerLayer)]
    layers[0].enable_adapters(False)
    with policy.reference_model():
        assert policy.model.get_model_status().enabled is False
    assert layers[0].disable_adapters and not layers[1].disable_adapters


def test_lora_target_modules_list(tiny_model_dir: Path) -> None:
    lora = LoraSettings(r=2, alpha=4.0, target_modules=["q_proj", "v_proj"])
    policy = load_policy(str(tiny_model_dir), lora=lora, need_reference=False)
    names = [n for n, _ in policy.model.named_parameters() if "lora_A" in n]
    assert len(names) == 2 * 2  # 2 layers x (q, v)
    assert all("q_proj" in n or "v_proj" in n for n in names)


def test_gradient_checkpointing_trains(tiny_model_dir: Path) -> None:
    for lora in (None, LORA):
        policy = load_policy(
            str(tiny_model_dir), lora=lora, gradient_checkpointing=True, need_reference=False
        )
        inner = policy.model.get_base_model() if lora else policy.model
        assert inner.is_activation_checkpointing
        policy.model(input_ids=PROMPT).logits.float().mean().backward()
        grads = [p.grad for p in policy.trainable_parameters()]
        assert all(g is not None for g in grads)
        assert any(float(g.abs().sum()) > 0 for g in grads if g is not None)


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_is_checkpointing_agrees_with_transformers(
    tiny_model_dir: Path, lora: LoraSettings | None
) -> None:
    for every_n_layers in (1, 2):
        policy = load_policy(str(tiny_model_dir), lora=lora, need_reference=False)
        inner = hf_model(policy.model)
        assert not is_checkpointing(policy.model) and not inner.is_activation_checkpointing
        inner.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=every_n_layers
        )
        assert inner.is_activation_checkpointing and is_checkpointing(policy.model)
        policy.model.eval()  # checkpointing does nothing outside training
        assert not is_checkpointing(policy.model)
        policy.model.train()
        inner.activation_checkpointing_disable()
        assert not inner.is_activation_checkpointing and not is_checkpointing(policy.model)


def test_quantised_model_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    qdir = tmp_path / "quantised"
    shutil.copytree(tiny_model_dir, qdir)
    config = json.loads((qdir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gguf", "gguf_file": "x.gguf"}
    (qdir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="quantised"):
        load_policy(str(qdir), need_reference=False)


# --- init_from and save ------------------------------------------------------------------------


def test_init_from_full_checkpoint_becomes_reference(tiny_model_dir: Path, tmp_path: Path) -> None:
    warm = load_policy(str(tiny_model_dir), need_reference=False)
    base = logits_of(warm.model)
    perturb_all(warm.model, seed=3)
    expected = logits_of(warm.model)
    warm.save(tmp_path / "sft")
    assert json.loads((tmp_path / "sft" / POLICY_FILE).read_text())["kind"] == "full"

    policy = load_policy(str(tiny_model_dir), need_reference=True, init_from=tmp_path / "sft")
    torch.testing.assert_close(logits_of(policy.model), expected)
    with policy.reference_model() as ref:
        torch.testing.assert_close(logits_of(ref), expected)
        assert not torch.allclose(logits_of(ref), base, atol=1e-3)

    lora_policy = load_policy(
        str(tiny_model_dir), lora=LORA, need_reference=True, init_from=tmp_path / "sft"
    )
    with lora_policy.reference_model() as ref:
        torch.testing.assert_close(logits_of(ref), expected)


def test_init_from_adapter_is_merged_then_fresh_lora(tiny_model_dir: Path, tmp_path: Path) -> None:
    sft = load_policy(str(tiny_model_dir), lora=LORA, need_reference=False)
    perturb_lora(sft, seed=4)
    expected = logits_of(sft.model)
    sft.save(tmp_path / "sft-adapter")
    assert (tmp_path / "sft-adapter" / "adapter_config.json").is_file()
    assert not (tmp_path / "sft-adapter" / "model.safetensors").exists()

    full = load_policy(str(tiny_model_dir), need_reference=True, init_from=tmp_path / "sft-adapter")
    assert not full.uses_adapter
    torch.testing.assert_close(logits_of(full.model), expected, rtol=1e-4, atol=1e-5)
    with full.reference_model() as ref:
        torch.testing.assert_close(logits_of(ref), expected, rtol=1e-4, atol=1e-5)

    policy = load_policy(
        str(tiny_model_dir), lora=LORA, need_reference=True, init_from=tmp_path / "sft-adapter"
    )
    # a fresh adapter starts at zero (lora_B = 0), so policy == reference == warm start
    torch.testing.assert_close(logits_of(policy.model), expected, rtol=1e-4, atol=1e-5)
    perturb_lora(policy, seed=5)
    after = logits_of(policy.model)
    with policy.reference_model() as ref:
        torch.testing.assert_close(logits_of(ref), expected, rtol=1e-4, atol=1e-5)

    # An adapter trained on top of the warm start reloads onto the same warm start.
    policy.save(tmp_path / "grpo-adapter")
    info = json.loads((tmp_path / "grpo-adapter" / POLICY_FILE).read_text())
    assert info["kind"] == "adapter"
    assert info["init_from"] == str((tmp_path / "sft-adapter").resolve())
    resumed = load_policy(
        str(tiny_model_dir), need_reference=False, init_from=tmp_path / "grpo-adapter"
    )
    torch.testing.assert_close(logits_of(resumed.model), after, rtol=1e-4, atol=1e-5)

    # merged save: a full model with both adapters in, loadable without peft
    policy.save(tmp_path / "merged", merged=True)
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    merged = load_policy(str(tmp_path / "merged"), need_reference=False)
    torch.testing.assert_close(logits_of(merged.model), after, rtol=1e-4, atol=1e-5)
    # merging a copy left the trained policy's adapter in place
    assert policy.trainable_parameters()


def test_bad_init_from_is_a_user_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a directory"):
        load_policy(str(tiny_model_dir), need_reference=False, init_from=tmp_path / "missing")
    with pytest.raises(UserError, match="neither adapter_config.json"):
        load_policy(str(tiny_model_dir), need_reference=False, init_from=tmp_path)


def test_adapter_for_another_shape_is_a_user_error(
    tiny_model_dir: Path, tiny_model_factory: object, tmp_path: Path
) -> None:
    wide_dir = tiny_model_factory(seed=0, hidden_size=32, intermediate_size=64)  # type: ignore[operator]
    other = load_policy(str(wide_dir), lora=LORA, need_reference=False)
    other.save(tmp_path / "adapter")
    with pytest.raises(UserError, match="does not fit"):
        load_policy(str(tiny_model_dir), need_reference=False, init_from=tmp_path / "adapter")


def test_save_replaces_atomically(tiny_model_dir: Path, tmp_path: Path) -> None:
    policy = load_policy(str(tiny_model_dir), need_reference=False)
    target = tmp_path / "ckpt"
    policy.save(target)
    first = logits_of(policy.model)
    perturb_all(policy.model, seed=6)
    policy.save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp or stale dirs left
    reloaded = load_policy(str(target), need_reference=False)
    torch.testing.assert_close(logits_of(reloaded.model), logits_of(policy.model))
    assert not torch.allclose(logits_of(reloaded.model), first, atol=1e-3)
    assert reloaded.tokenizer.chat_template == policy.tokenizer.chat_template


def test_saved_checkpoint_is_readable_by_others_under_umask_022(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Saved under a temporary directory and renamed: the directory gets mkdir's mode, not
    mkdtemp's 0700, so that another account can load or serve it."""
    import os
    import stat

    policy = load_policy(str(tiny_model_dir), lora=LORA, need_reference=False)
    old = os.umask(0o022)
    try:
        policy.save(tmp_path / "adapter")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "adapter").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "adapter" / POLICY_FILE).stat().st_mode) == 0o644
