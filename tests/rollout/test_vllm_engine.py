"""The vLLM engine: weight naming, LoRA merging and the memory/dtype/thread translations
everywhere; generation and weight sync through a real vLLM where vLLM runs (a CUDA GPU, or vLLM's
CPU build: ``bash scripts/setup.sh vllm`` then ``make test-vllm``).

The weight sync is the part that can silently go wrong (a misnamed tensor is skipped or loaded
into the wrong place, a packed copy keeps old weights), so the names and merged values are checked
against peft's own merge without vLLM, and with vLLM the engine's log-probs are checked against
the trainer's own recomputation after real optimizer steps.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpokit.core.losses import (
    LossInputs,
    LossSettings,
    MismatchCorrection,
    mismatch_weights,
    policy_loss,
)
from grpokit.errors import UserError
from grpokit.models.loading import LoraSettings, Policy, load_policy
from grpokit.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from grpokit.rollout.torch_engine import TorchEngine
from grpokit.rollout.vllm_engine import (
    CPU_KV_BLOCK,
    LoraSync,
    VLLMEngine,
    cpu_kv_cache_bytes,
    dense_weights,
    finish_reason,
    kv_bytes_per_token,
    launcher_env,
    torch_threads_kept,
    vllm_available,
    vllm_dtype,
    vllm_lora_rank,
    vllm_param_name,
    vllm_platform,
)
from grpokit.train.forward import completion_logprobs, completion_scores, pack

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(
    not vllm_available(),
    reason="needs vLLM on a CUDA GPU (pip install 'grpokit[vllm]') or vLLM's CPU build "
    f"(bash scripts/setup.sh vllm; make test-vllm); here: vllm={HAS_VLLM}",
)
EOS = 2


def test_names_map_to_the_dense_model() -> None:
    assert vllm_param_name("base_model.model.model.layers.0.mlp.up_proj.base_layer.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert (
        vllm_param_name("base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight") is None
    )
    assert vllm_param_name("base_model.model.lm_head.modules_to_save.default.weight") == (
        "lm_head.weight"
    )
    assert vllm_param_name("base_model.model.lm_head.original_module.weight") is None
    assert vllm_param_name("model.norm.weight") == "model.norm.weight"


def test_lora_sync_sends_the_merged_dense_weights(tiny_model_dir: Path) -> None:
    """What sync_weights would send for a LoRA policy = the merged model's own state dict."""
    policy = load_policy(
        str(tiny_model_dir),
        lora=LoraSettings(r=4, alpha=8),
        need_reference=False,
        device=torch.device("cpu"),
    )
    model = policy.model
    with torch.no_grad():  # a non-zero adapter, so merging changes the weights
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sent = {n: t.clone() for n, t in dense_weights(model)}
    # Merged as they are sent: training continues on parameters left exactly as they were.
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n

    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    expected_names = {n for n, _ in plain.named_parameters()}
    assert set(sent) == expected_names
    # peft's merge of a copy gives the values vLLM must receive.
    reference = copy.deepcopy(model).merge_and_unload()
    for name, value in reference.named_parameters():
        assert torch.equal(sent[name], value.detach()), name  # rounded as peft's merge rounds
    unmerged = dict(dense_weights(model, merge_lora=False))  # the adapter sync's base weights
    assert all(torch.equal(unmerged[n], dict(plain.named_parameters())[n]) for n in unmerged)
    changed = [n for n in sent if not torch.equal(sent[n], dict(plain.named_parameters())[n])]
    assert any("q_proj" in n for n in changed), "the merged LoRA delta must reach vLLM"


def test_finish_reason_from_the_last_token() -> None:
    assert finish_reason([5, 6, EOS], {EOS}) == "eos"
    assert finish_reason([5, 6, 7], {EOS}) == "length"
    assert finish_reason([], {EOS}) == "length"


@pytest.mark.skipif(vllm_available(), reason="vLLM is usable here")
def test_a_clear_error_without_vllm_or_cuda(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(UserError, match="vllm|CUDA"):
        VLLMEngine(model, model_path=str(tiny_model_dir), eos_token_ids=[EOS])


def _device() -> torch.device:
    return torch.device("cuda" if vllm_platform() == "cuda" else "cpu")


def _engine(model: torch.nn.Module, path: Path, lora_sync: LoraSync = "merged") -> VLLMEngine:
    """A colocated engine for the tiny models: a small memory share either way (on CPU it goes
    to the KV cache, capped at what 64 sequences of 256 tokens need)."""
    return VLLMEngine(
        model,
        model_path=str(path),
        eos_token_ids=[EOS],
        gpu_memory_utilization=0.2,
        max_model_len=256,
        max_num_seqs=64,
        dtype=torch.float32,
        lora_sync=lora_sync,
    )


@pytest.mark.slow
@needs_vllm
def test_colocated_generation_and_weight_sync(vllm_tiny_model_dir: Path) -> None:
    path = vllm_tiny_model_dir
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(_device()).eval()
    launcher_vars = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    engine = _engine(model, path)
    assert isinstance(engine, RolloutEngine)
    # The build's launcher variables are gone (a later subprocess must not inherit its port).
    assert {k: os.environ.get(k) for k in launcher_vars} == launcher_vars
    prompts = [[1, 2000, 300, 45, 7], [88, 99, 17]]
    greedy = SamplingParams(max_completion_length=12, temperature=0.0)
    batch = engine.generate(prompts, 3, greedy)
    assert len(batch) == 6 and batch.group_size == 3
    assert all(
        len(c) == len(lp) for c, lp in zip(batch.completion_ids, batch.logprobs, strict=True)
    )
    # Greedy vLLM equals greedy torch on the same weights (float32, short completions).
    reference = TorchEngine(model, eos_token_ids=[EOS], pad_token_id=EOS).generate(
        prompts, 1, greedy
    )
    assert [batch.completion_ids[0], batch.completion_ids[3]] == reference.completion_ids

    with torch.no_grad():  # a different policy: sync must change what vLLM generates
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    engine.sync_weights()
    after = engine.generate(prompts, 1, greedy)
    moved = TorchEngine(model, eos_token_ids=[EOS], pad_token_id=EOS).generate(prompts, 1, greedy)
    assert after.completion_ids == moved.completion_ids
    assert after.completion_ids != reference.completion_ids

    sampled = engine.generate(prompts, 4, SamplingParams(max_completion_length=12))
    assert len({tuple(c) for c in sampled.completion_ids[:4]}) > 1, "samples of a group differ"

    # With every third token an end token, completions end early, unless ignore_eos.
    engine.eos_token_ids = list(range(0, model.config.vocab_size, 3))
    ended = engine.generate(prompts, 4, SamplingParams(max_completion_length=12))
    assert min(ended.completion_lengths) < 12 and "eos" in ended.finish_reason
    full = engine.generate(prompts, 4, SamplingParams(max_completion_length=12, ignore_eos=True))
    assert full.completion_lengths == [12] * 8 and set(full.finish_reason) == {"length"}


@pytest.mark.parametrize("decoder", ["static", "hf"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_engine_decodes_lora_merged_and_restores_the_weights(
    tiny_model_dir: Path, dtype: str, decoder: Literal["static", "hf"]
) -> None:
    """Merging for decoding changes no log-prob beyond rounding and leaves the weights as they
    were, bit for bit: the static decoder adds the adapter into its own copy, transformers'
    forward merges in place and copies the saved weights back."""
    policy = load_policy(
        str(tiny_model_dir),
        dtype=dtype,  # type: ignore[arg-type]
        lora=LoraSettings(r=4, alpha=8),
        need_reference=False,
        device=torch.device("cpu"),
    )
    model = policy.model
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = TorchEngine(model, eos_token_ids=[EOS], pad_token_id=EOS, decoder=decoder)
    batch = engine.generate(
        [[1, 2000, 300, 45, 7]], 2, SamplingParams(max_completion_length=6, temperature=0.0)
    )
    assert not any(getattr(m, "merged", False) for m in model.modules())
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
    # The sampled tokens' log-probs under the unmerged adapter (the trained policy).
    ids = torch.tensor([[1, 2000, 300, 45, 7, *batch.completion_ids[0]]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, 4:-1].float()
    recomputed = logits.log_softmax(-1).gather(-1, ids[0, 5:, None]).squeeze(-1)
    tol = 5e-2 if dtype == "bfloat16" else 1e-4
    torch.testing.assert_close(batch.logprobs[0], recomputed, rtol=0, atol=tol)


# ---- the translations to vLLM's terms (no vLLM needed) --------------------------------------


def test_the_kv_cache_on_cpu_is_the_share_of_free_memory_capped_at_what_the_batch_uses() -> None:
    gib = 1 << 30
    # A share of what is available now, when nothing caps it.
    assert cpu_kv_cache_bytes(
        0.25, 8 * gib, per_token=None, max_num_seqs=64, max_model_len=512
    ) == (2 * gib)
    # 64 sequences of 300 tokens hold 3 whole blocks of 128 tokens each, at 1 KiB a token.
    capped = cpu_kv_cache_bytes(0.25, 8 * gib, per_token=1024, max_num_seqs=64, max_model_len=300)
    assert capped == 64 * 3 * CPU_KV_BLOCK * 1024
    assert cpu_kv_cache_bytes(1e-12, 8 * gib, per_token=1, max_num_seqs=1, max_model_len=1) == 1


def test_kv_bytes_per_token_from_the_model_config(vllm_tiny_model_dir: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(vllm_tiny_model_dir)
    # keys and values x 2 layers x 1 KV head x head size 32 (64 wide / 2 heads), in bfloat16
    assert kv_bytes_per_token(config, torch.bfloat16) == 2 * 2 * 1 * 32 * 2
    assert kv_bytes_per_token(object(), torch.float32) is None


def test_the_adapter_sync_asks_vllm_for_a_rank_it_takes() -> None:
    from peft import LoraConfig

    assert vllm_lora_rank(LoraConfig(r=4)) == 8
    assert vllm_lora_rank(LoraConfig(r=16)) == 16
    assert vllm_lora_rank(LoraConfig(r=8, rank_pattern={"q_proj": 40})) == 64
    with pytest.raises(UserError, match="ranks up to 512, this adapter's is 600.*merged"):
        vllm_lora_rank(LoraConfig(r=600))
    with pytest.raises(UserError, match=r"modules_to_save \['lm_head'\].*vllm_lora_sync: merged"):
        vllm_lora_rank(LoraConfig(r=8, modules_to_save=["lm_head"]))


def test_vllm_computes_in_the_policys_compute_dtype() -> None:
    assert vllm_dtype(torch.bfloat16) == "bfloat16"
    assert vllm_dtype(torch.float32) == "float32"
    assert vllm_dtype("float16") == "float16"


def test_the_thread_setting_survives_an_engine_that_replaces_it() -> None:
    """What vLLM's CPU worker does to the process (torch.set_num_threads becomes a no-op) is
    undone when the engine is built, and the count checked."""
    before, setter = torch.get_num_threads(), torch.set_num_threads
    with torch_threads_kept() as threads:
        torch.set_num_threads = lambda n: None  # as vLLM's CPU worker does
        assert threads == before
    assert torch.set_num_threads is setter
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("under_torchrun", [False, True])
def test_launcher_variables_last_only_as_long_as_the_engine_build(
    monkeypatch: pytest.MonkeyPatch, under_torchrun: bool
) -> None:
    """Without torchrun the engine build gets a rank, a world and a free port, and the process
    is left without them, so a subprocess started later does not inherit a port this process
    holds; under torchrun the launcher's own values are used and kept."""
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    for key in keys:
        monkeypatch.delenv(key, raising=False)
    launched = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.2"}
    launched["MASTER_PORT"] = "29511"
    if under_torchrun:
        for key, value in launched.items():
            monkeypatch.setenv(key, value)
    with launcher_env() as rank:
        inside = {key: os.environ[key] for key in keys}
    if under_torchrun:
        assert rank == 3 and inside == launched
        assert {key: os.environ[key] for key in keys} == launched
    else:
        assert rank == 0 and inside["WORLD_SIZE"] == "1" and int(inside["MASTER_PORT"]) > 0
        assert not any(key in os.environ for key in keys)


# ---- a real vLLM (CUDA GPU or vLLM's CPU build) ---------------------------------------------

PROMPTS = [[1, 2000, 300, 45, 7], [88, 99, 17], [5, 6, 7, 8, 9, 10], [400, 401]]
TEMPERATURE = 0.7
AGREE = 1e-3  # float32 vLLM against float32 torch; measured 2-7e-5 on CPU


def _recomputed(model: torch.nn.Module, batch: RolloutBatch) -> list[torch.Tensor]:
    """The trainer's log-probs of the batch's tokens (grpokit.train.forward), one row each."""
    prompts = [batch.prompt_ids[i // batch.group_size] for i in range(len(batch))]
    tokens = pack(prompts, batch.completion_ids, pad_token_id=EOS).to(_device())
    with torch.no_grad():
        logp, _ = completion_logprobs(model, tokens, temperature=TEMPERATURE)
    return [logp[i, : len(c)].cpu() for i, c in enumerate(batch.completion_ids)]


def _max_gap(model: torch.nn.Module, batch: RolloutBatch) -> float:
    mine = _recomputed(model, batch)
    return max(float((a - b).abs().max()) for a, b in zip(mine, batch.logprobs, strict=True))


def _sample(engine: VLLMEngine) -> RolloutBatch:
    return engine.generate(
        PROMPTS, 8, SamplingParams(max_completion_length=32, temperature=TEMPERATURE)
    )


@pytest.fixture(params=["full", "lora", "lora-adapter"])
def policy_and_engine(request, vllm_tiny_model_dir: Path) -> Iterator[tuple[Policy, VLLMEngine]]:  # type: ignore[no-untyped-def]
    """A float32 policy and a colocated engine: full fine-tuning, LoRA synced merged, or LoRA
    synced as the adapter alone (vLLM's LoRA support)."""
    lora = LoraSettings(r=8, alpha=16) if request.param.startswith("lora") else None
    policy = load_policy(
        str(vllm_tiny_model_dir), dtype="float32", lora=lora, need_reference=False, device=_device()
    )
    if lora is not None:  # a warm start: the base weights are no longer what vLLM loads
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "base_layer" in name:
                    p.mul_(1.1)
    threads = torch.get_num_threads()
    sync: LoraSync = "adapter" if request.param == "lora-adapter" else "merged"
    engine = _engine(policy.model, vllm_tiny_model_dir, sync)
    assert engine.adapter_rank == (8 if sync == "adapter" else None)
    engine.sync_weights()  # as the trainer's set-up does
    assert torch.get_num_threads() == threads, "building vLLM changed the trainer's threads"
    yield policy, engine


@pytest.mark.slow
@needs_vllm
def test_vllm_logprobs_agree_with_the_trainers_recomputation(
    policy_and_engine: tuple[Policy, VLLMEngine],
) -> None:
    policy, engine = policy_and_engine
    batch = _sample(engine)
    assert len(batch) == 32
    assert all(
        len(lp) == len(c) for c, lp in zip(batch.completion_ids, batch.logprobs, strict=True)
    )
    assert _max_gap(policy.model, batch) < AGREE


@pytest.mark.slow
@needs_vllm
def test_vllm_follows_the_policy_after_optimizer_steps(
    policy_and_engine: tuple[Policy, VLLMEngine],
) -> None:
    """Real AdamW steps on the policy (full fine-tuning, or LoRA merged for the sync), then
    sync_weights: vLLM's log-probs agree with the updated policy's, and the update was large
    enough that the old weights would not."""
    policy, engine = policy_and_engine
    model = policy.model
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=3e-2)
    for _ in range(2):
        batch = _sample(engine)
        prompts = [batch.prompt_ids[i // batch.group_size] for i in range(len(batch))]
        tokens = pack(prompts, batch.completion_ids, pad_token_id=EOS).to(_device())
        before_step = copy.deepcopy(model)
        model.train()
        logp, _ = completion_logprobs(model, tokens, temperature=TEMPERATURE)
        loss = -(logp * tokens.completion_mask).sum() / tokens.completion_mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.eval()
        engine.sync_weights()
        after = _sample(engine)
        assert _max_gap(model, after) < AGREE
        # The step moved the policy well beyond that tolerance: stale weights would show.
        assert _max_gap(before_step, after) > 20 * AGREE
    # The frozen base weights under LoRA are exactly as loaded: the merge is undone by copy.
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p.detach(), frozen[n]), n


@needs_vllm
@pytest.mark.skipif(vllm_platform() != "cpu", reason="a limit of vLLM's CPU attention")
def test_a_head_size_vllm_on_cpu_cannot_run_is_refused_clearly(tiny_model: torch.nn.Module) -> None:
    path = tiny_model.config.name_or_path  # the default tiny model: head size 16
    with pytest.raises(UserError, match="head sizes .* this model's is 16"):
        VLLMEngine(tiny_model, model_path=path, eos_token_ids=[EOS])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU trainer uses TRL's server and NCCL")
def test_server_mode_without_a_server_is_a_clear_error(tiny_model: torch.nn.Module) -> None:
    """Without NCCL the trainer needs no vLLM itself, only a server to answer."""
    from grpokit.rollout.vllm_engine import _free_port

    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(UserError, match="no vLLM server answers at http://127.0.0.1"):
        VLLMEngine(
            tiny_model, model_path="unused", eos_token_ids=[EOS], mode="server", server_url=url
        )


def _mismatch_metrics(
    sampler: list[torch.Tensor], trainer: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The loss's mismatch metrics (TRL's default correction: sequence_mask, clip_max 3) for the
    sampler's and the trainer's log-probs of the same tokens, on-policy (mu = 1: old = trainer),
    and ``weight_mean``: the mean correction weight, the share of each token's gradient left."""
    sampler_logp = torch.nn.utils.rnn.pad_sequence(sampler, batch_first=True)
    width = sampler_logp.shape[1]
    trainer, mask = trainer[:, :width].cpu(), mask[:, :width].cpu()
    correction = MismatchCorrection()
    x = LossInputs(trainer, None, torch.ones(len(sampler)), mask, sampler_logp=sampler_logp)
    out = policy_loss(x, LossSettings(mismatch=correction))
    weight, _, _ = mismatch_weights(trainer, sampler_logp, mask.bool(), correction)
    metrics = {k: float(v) for k, v in out.metrics.items() if k.startswith("mismatch/")}
    return metrics | {"weight_mean": float(weight[mask.bool()].mean())}


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.9), (20, 0.9)])
def test_truncated_sampling_ratios_on_the_distribution_vllm_draws_from(
    vllm_tiny_model_dir: Path, top_k: int, top_p: float, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM exactly synchronised with a float32 policy, sampling with top_p 0.9 (and top_k 20):
    its processed_logprobs are of the truncated distribution. Scored on the full softmax (the
    trainer before training.truncated_logprobs) every token's ratio is S, the kept mass, and the
    mismatch metrics sit far from 0; scored on the same truncated distribution they are float32
    rounding."""
    policy = load_policy(
        str(vllm_tiny_model_dir), dtype="float32", need_reference=False, device=_device()
    )
    engine = _engine(policy.model, vllm_tiny_model_dir)
    engine.sync_weights()
    params = SamplingParams(
        max_completion_length=32, temperature=TEMPERATURE, top_k=top_k, top_p=top_p
    )
    batch = engine.generate(PROMPTS, 8, params)
    prompts = [PROMPTS[i // batch.group_size] for i in range(len(batch))]
    tokens = pack(prompts, batch.completion_ids, pad_token_id=EOS).to(_device())
    with torch.no_grad():
        full, _, _ = completion_scores(policy.model, tokens, temperature=TEMPERATURE)
        truncated, _, log_kept = completion_scores(
            policy.model, tokens, temperature=TEMPERATURE, truncation=(top_k, top_p)
        )
    assert log_kept is not None
    mask = tokens.completion_mask
    before = _mismatch_metrics(batch.logprobs, full, mask)
    after = _mismatch_metrics(batch.logprobs, truncated, mask)
    kept_mass = float(log_kept.exp()[mask.bool()].mean().cpu())
    with capsys.disabled():
        print(f"\ntop_k={top_k} top_p={top_p} kept mass {kept_mass:.4f}")
        print(f"  full softmax (before): {before}\n  truncated (after):     {after}")
    gaps = [
        float((truncated[i, : len(lp)].cpu() - lp).abs().max())
        for i, lp in enumerate(batch.logprobs)
    ]
    assert max(gaps) < AGREE
    assert after["mismatch/kl"] < 1e-6 and abs(after["mismatch/max_ratio"] - 1) < 1e-2
    assert after["mismatch/masked_frac"] == 0.0 and after["weight_mean"] > 0.95
    assert kept_mass < 0.97
    assert before["mismatch/kl"] > 100 * max(after["mismatch/kl"], 1e-8)
    assert before["mismatch/max_ratio"] < 1.0  # every token's ratio is its S < 1
    assert before["weight_mean"] < 0.5  # the correction scales most of the gradient away
