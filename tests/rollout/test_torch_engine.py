from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from grpokit.core.truncation import truncated_log_softmax
from grpokit.models.loading import LoraSettings, load_policy
from grpokit.models.onednn import onednn_available, set_compute_dtype
from grpokit.native import decoders
from grpokit.native.decoders import (
    HFDecoder,
    StaticLlamaDecoder,
)
from grpokit.native.heuristics import merged_lora_fits, unmerged_lora_pays
from grpokit.rollout import torch_engine
from grpokit.rollout.base import (
    EngineCapabilities,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    without_reference_logprobs,
)
from grpokit.rollout.torch_engine import (
    COMPACT_WHEN_DONE,
    TorchEngine,
    free_device_bytes,
    left_pad,
)
from grpokit.train.forward import completion_logprobs, pack
from grpokit.train.fsdp import GatheredEngine

EOS = 2  # <|im_end|> in the SmolLM2 tokenizer
PROMPTS = [[1, 2000, 300, 45, 7], [88, 99], [5, 6, 7, 8, 9, 10, 11, 12, 13], [400], [17, 4096, 31]]


@pytest.fixture(scope="module")
def peaked_model_dir(tiny_model_factory: Callable[..., Path]) -> Path:
    # A wider initialisation makes the random model's next token depend on its context (with the
    # default 0.02 it repeats one token), so greedy comparisons actually exercise padding.
    return tiny_model_factory(seed=1, initializer_range=0.3)


@pytest.fixture
def model(peaked_model_dir: Path) -> PreTrainedModel:
    loaded: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        peaked_model_dir, dtype=torch.float32
    )
    return loaded.eval()


EngineFor = Callable[..., TorchEngine]


@pytest.fixture(params=["static", "hf"])
def engine_for(request: pytest.FixtureRequest) -> EngineFor:
    """``engine_for(model, eos=None)``: an engine on each decoder (the tiny model is a Llama, so
    "static" really runs the static decoder: it raises where it cannot)."""

    def make(model: torch.nn.Module, eos: list[int] | None = None) -> TorchEngine:
        return TorchEngine(
            model, eos_token_ids=eos or [EOS], pad_token_id=EOS, decoder=request.param
        )

    return make


def hf_greedy(model: PreTrainedModel, prompt: list[int], max_new: int, eos: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=EOS,
    )
    completion: list[int] = out[0, len(prompt) :].tolist()
    # generate pads finished rows; cut after the first EOS as the engine does
    for i, tok in enumerate(completion):
        if tok in eos:
            return completion[: i + 1]
    return completion


def recomputed_logprobs(
    model: torch.nn.Module,
    prompt: list[int],
    completion: list[int],
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Log-probs of ``completion`` under softmax(logits / T), truncated by top_k / top_p and
    renormalised over the kept tokens (core.truncation's rule) where they are set."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    logp, _ = truncated_log_softmax(logits[len(prompt) - 1 : -1], top_k=top_k, top_p=top_p)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_is_a_rollout_engine(model: PreTrainedModel, engine_for: EngineFor) -> None:
    engine = engine_for(model)
    assert isinstance(engine, RolloutEngine)
    assert engine.capabilities == EngineCapabilities(reference_logprobs=True)
    assert engine.weight_version is None
    with pytest.raises(NotImplementedError, match="does not generate ahead"):
        engine.prefetch([[1, 2]], 2, SamplingParams(max_completion_length=4))


def test_a_wrapper_offers_and_switches_what_its_engine_offers(model: PreTrainedModel) -> None:
    """The FSDP wrapper declares its engine's capabilities, and turning the reference rows off
    for a held-out check reaches the engine through it (a type check on the wrapper did not)."""
    inner = TorchEngine(model, eos_token_ids=[2], pad_token_id=2, reference_logprobs=True)
    wrapped = GatheredEngine(inner, model)
    assert wrapped.capabilities.reference_logprobs and wrapped.reference_logprobs
    with without_reference_logprobs(wrapped):
        assert not inner.reference_logprobs
    assert inner.reference_logprobs


def test_left_pad_positions() -> None:
    ids, mask, pos = left_pad([[5, 6, 7], [8]], pad_token_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_greedy_equals_hf_generate(model: PreTrainedModel, engine_for: EngineFor) -> None:
    limit = 16
    # the greedy text of one prompt, its 5th token as an extra EOS: some rows stop early
    stop = hf_greedy(model, PROMPTS[0], limit, [EOS])[4]
    eos = [EOS, stop]
    batch = engine_for(model, eos).generate(
        PROMPTS, 2, SamplingParams(max_completion_length=limit, temperature=0.0)
    )
    expected = [hf_greedy(model, p, limit, eos) for p in PROMPTS]
    assert len({tuple(e) for e in expected}) == len(PROMPTS)  # the prompts really differ
    assert any(len(e) < limit for e in expected)
    for i, want in enumerate(expected):
        for row in (2 * i, 2 * i + 1):
            assert batch.completion_ids[row] == want
            assert batch.finish_reason[row] == ("eos" if want[-1] in eos else "length")


def test_logprobs_equal_full_forward_recomputation(
    model: PreTrainedModel, engine_for: EngineFor
) -> None:
    # many EOS tokens make completions end at different steps, so rows leave the batch mid-way
    eos = list(range(0, 49152, 40))
    params = SamplingParams(max_completion_length=16, temperature=0.7, top_k=50, top_p=0.9)
    gen = torch.Generator().manual_seed(3)
    batch = engine_for(model, eos).generate(PROMPTS, 3, params, generator=gen)
    assert len(set(batch.completion_lengths)) > 2
    for row, completion in enumerate(batch.completion_ids):
        got = batch.logprobs[row]
        assert got.dtype == torch.float32 and got.shape == (len(completion),)
        prompt = PROMPTS[batch.prompt_index(row)]
        want = recomputed_logprobs(model, prompt, completion, 0.7, top_k=50, top_p=0.9)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_group_layout_and_eos(model: PreTrainedModel, engine_for: EngineFor) -> None:
    eos = list(range(0, 49152, 25))
    eos_set = set(eos)
    limit, n = 12, 3
    gen = torch.Generator().manual_seed(0)
    batch = engine_for(model, eos).generate(
        PROMPTS, n, SamplingParams(max_completion_length=limit), generator=gen
    )
    assert isinstance(batch, RolloutBatch)
    assert batch.group_size == n and len(batch) == len(PROMPTS) * n
    assert batch.prompt_ids == PROMPTS
    assert {"eos", "length"} == set(batch.finish_reason)
    for completion, reason in zip(batch.completion_ids, batch.finish_reason, strict=True):
        assert all(tok not in eos_set for tok in completion[:-1])
        if reason == "eos":
            assert completion[-1] in eos_set and len(completion) <= limit
        else:
            assert completion[-1] not in eos_set and len(completion) == limit
    # each group's rows score under their own prompt: check one row of every group
    for i, prompt in enumerate(PROMPTS):
        row = i * n + n - 1
        want = recomputed_logprobs(model, prompt, batch.completion_ids[row], 1.0)
        torch.testing.assert_close(batch.logprobs[row], want, rtol=0, atol=1e-4)


def test_ignore_eos_samples_the_full_length(model: PreTrainedModel, engine_for: EngineFor) -> None:
    """With every 25th token an EOS, a 12-token completion often ends early; under ignore_eos
    every completion runs to the limit ("length"), EOS tokens inside included, each log-prob
    still the model's."""
    eos = list(range(0, 49152, 25))
    params = SamplingParams(max_completion_length=12, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    batch = engine_for(model, eos).generate(PROMPTS, 3, params, generator=gen)
    assert batch.completion_lengths == [12] * len(batch)
    assert set(batch.finish_reason) == {"length"}
    assert any(tok in set(eos) for c in batch.completion_ids for tok in c[:-1])
    row = len(batch) - 1
    want = recomputed_logprobs(model, PROMPTS[-1], batch.completion_ids[row], 1.0)
    torch.testing.assert_close(batch.logprobs[row], want, rtol=0, atol=1e-4)


def test_seeding_is_deterministic(model: PreTrainedModel, engine_for: EngineFor) -> None:
    engine = engine_for(model, list(range(0, 49152, 30)))
    params = SamplingParams(max_completion_length=10, temperature=1.0, top_p=0.95)

    def run(seed: int) -> RolloutBatch:
        return engine.generate(PROMPTS, 4, params, generator=torch.Generator().manual_seed(seed))

    a, b, c = run(7), run(7), run(8)
    assert a.completion_ids == b.completion_ids and a.finish_reason == b.finish_reason
    assert all(torch.equal(x, y) for x, y in zip(a.logprobs, b.logprobs, strict=True))
    assert a.completion_ids != c.completion_ids
    # a group's members are different samples
    assert len({tuple(ids) for ids in a.completion_ids[:4]}) > 1


@pytest.mark.parametrize("params", [{"top_k": 1}, {"top_p": 1e-6}], ids=["top_k=1", "top_p~0"])
def test_truncation_to_one_token_is_greedy(
    model: PreTrainedModel, params: dict[str, Any], engine_for: EngineFor
) -> None:
    engine = engine_for(model)
    greedy = engine.generate(PROMPTS, 1, SamplingParams(max_completion_length=8, temperature=0))
    sampled = engine.generate(
        PROMPTS,
        2,
        SamplingParams(max_completion_length=8, temperature=1.0, **params),
        generator=torch.Generator().manual_seed(0),
    )
    for i, want in enumerate(greedy.completion_ids):
        assert sampled.completion_ids[2 * i] == sampled.completion_ids[2 * i + 1] == want
    if "top_k" in params:  # greedy: log-probs of the untruncated distribution (< 0)
        assert all(bool((lp < -1e-3).all()) for lp in sampled.logprobs)
    else:  # of the distribution drawn from, as the trainer scores it: one token, log-prob 0
        assert all(bool((lp == 0).all()) for lp in sampled.logprobs)


def test_prompts_encoded_once_and_finished_rows_dropped(
    model: PreTrainedModel, engine_for: EngineFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int, int]] = []  # (method, rows, new tokens per row)

    def spy(cls: type, name: str) -> None:
        real = getattr(cls, name)

        def wrapped(self: Any, tokens: torch.Tensor, *args: Any) -> torch.Tensor:
            calls.append((name, tokens.shape[0], tokens.shape[1] if tokens.dim() == 2 else 1))
            out: torch.Tensor = real(self, tokens, *args)
            return out

        monkeypatch.setattr(cls, name, wrapped)

    for cls in (HFDecoder, StaticLlamaDecoder):
        spy(cls, "prefill")
        spy(cls, "step")
    engine = engine_for(model, list(range(0, 49152, 10)))
    batch = engine.generate(
        PROMPTS,
        4,
        SamplingParams(max_completion_length=20),
        generator=torch.Generator().manual_seed(1),
    )
    # one prefill of the P prompts (not P * n), then one token per row per step
    assert calls[0] == ("prefill", len(PROMPTS), max(len(p) for p in PROMPTS))
    steps = calls[1:]
    assert all(name == "step" and width == 1 for name, _, width in steps)
    sizes = [rows for _, rows, _ in steps]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] <= len(PROMPTS) * 4
    assert sizes[-1] < sizes[0]  # finished rows left the batch
    assert len(calls) == max(batch.completion_lengths)  # prefill + (longest - 1) steps
    # at every step, rows still in the decoder that had finished are fewer than 1 / COMPACT_WHEN_DONE
    lengths = batch.completion_lengths
    for step, rows in enumerate(sizes, start=1):
        going = sum(length > step for length in lengths)
        assert going <= rows and (rows - going) * COMPACT_WHEN_DONE < rows + COMPACT_WHEN_DONE


def test_mode_restored_and_gradient_checkpointing(
    peaked_model_dir: Path, engine_for: EngineFor
) -> None:
    reference = AutoModelForCausalLM.from_pretrained(peaked_model_dir).eval()
    want = engine_for(reference).generate(
        PROMPTS, 1, SamplingParams(max_completion_length=10, temperature=0)
    )
    policy = load_policy(str(peaked_model_dir), gradient_checkpointing=True, need_reference=False)
    assert policy.model.training
    for layer in policy.model.model.layers:
        # Active in train mode only: decoding must apply none (transformers' forward in eval
        # mode, the static decoder by construction).
        layer.self_attn.attention_dropout = 0.9
    got = engine_for(policy.model).generate(
        PROMPTS, 1, SamplingParams(max_completion_length=10, temperature=0)
    )
    assert policy.model.training  # restored
    assert got.completion_ids == want.completion_ids
    # and training still works afterwards (no inference tensors leaked into the model)
    policy.model(input_ids=torch.tensor([PROMPTS[0]])).logits.mean().backward()


def lora_policy(model_dir: Path, scale: float) -> Any:
    """A LoRA policy (r 4) whose B is random (standard deviation ``scale``): the adapter then
    changes what the model computes."""
    lora = LoraSettings(r=4, alpha=8.0)
    policy = load_policy(str(model_dir), lora=lora, need_reference=False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    return policy


def test_peft_model_generates_with_its_adapter(
    peaked_model_dir: Path, tmp_path: Path, engine_for: EngineFor
) -> None:
    policy = lora_policy(peaked_model_dir, scale=1.0)
    params = SamplingParams(max_completion_length=10, temperature=0)
    got = engine_for(policy.model).generate(PROMPTS, 1, params)
    policy.save(tmp_path / "merged", merged=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert got.completion_ids == engine_for(merged).generate(PROMPTS, 1, params).completion_ids
    base = AutoModelForCausalLM.from_pretrained(peaked_model_dir).eval()
    assert got.completion_ids != engine_for(base).generate(PROMPTS, 1, params).completion_ids
    assert policy.model.training


def test_lora_merged_copy_only_where_it_fits(peaked_model_dir: Path) -> None:
    """A merged copy of the adapted weights takes at most half the device's free memory, else the
    rollout decodes the adapter unmerged; on a CPU (no free-memory figure) it always may."""
    model = lora_policy(peaked_model_dir, scale=1.0).model
    adapted = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if name.endswith("base_layer.weight")
    )
    assert adapted > 0
    assert merged_lora_fits(model, None) and merged_lora_fits(model, 2 * adapted)
    assert not merged_lora_fits(model, 2 * adapted - 1)
    assert free_device_bytes(model) is None  # a CPU model
    plain = AutoModelForCausalLM.from_pretrained(peaked_model_dir).eval()
    assert merged_lora_fits(plain, 0)  # nothing to copy


@pytest.mark.parametrize("decoder", ["static", "hf"])
def test_a_full_device_decodes_lora_unmerged(
    peaked_model_dir: Path, decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the device has too little free memory for the copy (faked here: this machine has
    no GPU), neither decoder merges, even for a rollout long enough that merging pays, and the
    log-probs are the policy's."""
    policy = lora_policy(peaked_model_dir, scale=0.3)
    engine = TorchEngine(policy.model, eos_token_ids=[EOS], pad_token_id=EOS, decoder=decoder)
    params = SamplingParams(max_completion_length=64, temperature=0.7, ignore_eos=True)
    assert not unmerged_lora_pays(params.max_completion_length, len(PROMPTS) * 2)

    def no_copy(*args: Any) -> Any:
        raise AssertionError("a merged copy was made")

    monkeypatch.setattr(torch_engine, "free_device_bytes", lambda model: 0)
    monkeypatch.setattr(decoders, "merged_weight", no_copy)
    monkeypatch.setattr(torch_engine, "lora_merged", no_copy)
    batch = engine.generate(PROMPTS, 2, params, generator=torch.Generator().manual_seed(3))
    for row, completion in enumerate(batch.completion_ids[:4]):
        want = recomputed_logprobs(policy.model, PROMPTS[batch.prompt_index(row)], completion, 0.7)
        torch.testing.assert_close(batch.logprobs[row], want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("decoder", ["static", "static-fixed", "hf"])
def test_reference_logprobs_score_the_sampled_tokens_under_the_base(
    peaked_model_dir: Path, decoder: str
) -> None:
    """``reference_logprobs``: the static decoder samples from the LoRA policy and scores each
    sampled token under the base model too, also for rows that end early and leave the batch
    (or, with its fixed-shape steps, stay in it); transformers' forward leaves them to the
    trainer (None)."""
    policy = lora_policy(peaked_model_dir, scale=0.3)
    engine = TorchEngine(
        policy.model,
        eos_token_ids=list(range(0, 49152, 40)),
        pad_token_id=EOS,
        decoder="hf" if decoder == "hf" else "static",
        reference_logprobs=True,
        cuda_graphs=decoder == "static-fixed",  # on the CPU: the fixed steps, uncaptured
    )
    params = SamplingParams(max_completion_length=16, temperature=0.7)
    batch = engine.generate(PROMPTS, 3, params, generator=torch.Generator().manual_seed(3))
    if decoder == "hf":
        assert batch.ref_logprobs is None
        return
    assert batch.ref_logprobs is not None and len(set(batch.completion_lengths)) > 2
    farther = 0.0
    for row, completion in enumerate(batch.completion_ids):
        prompt = PROMPTS[batch.prompt_index(row)]
        want = recomputed_logprobs(policy.model, prompt, completion, 0.7)
        torch.testing.assert_close(batch.logprobs[row], want, rtol=0, atol=1e-4)
        with policy.model.disable_adapter():
            base = recomputed_logprobs(policy.model, prompt, completion, 0.7)
        torch.testing.assert_close(batch.ref_logprobs[row], base, rtol=0, atol=1e-4)
        farther = max(farther, float((want - base).abs().max()))
    assert farther > 0.1  # the adapter changes the scores: the two are told apart


def test_fixed_steps_decode_as_the_ordinary_steps(model: PreTrainedModel) -> None:
    """``cuda_graphs``, on the CPU: the static decoder's fixed-shape steps (what a CUDA graph
    replays, here run uncaptured) decode greedily the same tokens with the same log-probs as its
    ordinary steps, rows that end early kept in the batch instead of dropped."""
    eos = list(range(0, 49152, 25))
    params = SamplingParams(max_completion_length=12, temperature=0)
    batches = [
        TorchEngine(
            model, eos_token_ids=eos, pad_token_id=EOS, decoder="static", cuda_graphs=g
        ).generate(PROMPTS, 2, params)
        for g in (False, True)
    ]
    ordinary, fixed = batches
    assert {"eos", "length"} == set(ordinary.finish_reason)  # some rows ended early
    assert fixed.completion_ids == ordinary.completion_ids
    assert fixed.finish_reason == ordinary.finish_reason
    for got, want in zip(fixed.logprobs, ordinary.logprobs, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_input_validation(model: PreTrainedModel, engine_for: EngineFor) -> None:
    engine = engine_for(model)
    params = SamplingParams(max_completion_length=4)
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(PROMPTS, 0, params)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[1, 2], []], 2, params)
    with pytest.raises(ValueError, match="at least one prompt"):
        engine.generate([], 2, params)
    with pytest.raises(ValueError, match="EOS"):
        TorchEngine(model, eos_token_ids=[], pad_token_id=0)


@pytest.mark.skipif(
    not (onednn_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU or PyTorch build has no oneDNN bfloat16 kernels",
)
def test_bf16_engine_samples_what_the_bf16_training_forward_scores(
    peaked_model_dir: Path, engine_for: EngineFor
) -> None:
    """A policy marked for bfloat16 decodes in bfloat16 (its weights untouched) and returns
    float32 log-probs close to the training forward's: per token within 0.3 (measured on this
    wide random model: up to 0.14 with the static decoder, 0.11 with transformers' forward under
    autocast), against float32 rounding for the float32 engine."""
    policy = load_policy(str(peaked_model_dir), need_reference=False)
    set_compute_dtype(policy.model, torch.bfloat16)
    weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
    eos = list(range(0, 49152, 40))
    params = SamplingParams(max_completion_length=12, temperature=0.7)
    gen = torch.Generator().manual_seed(3)
    batch = engine_for(policy.model, eos).generate(PROMPTS, 3, params, generator=gen)
    assert all(torch.equal(v, policy.model.state_dict()[k]) for k, v in weights.items())
    prompts = [PROMPTS[batch.prompt_index(row)] for row in range(len(batch.completion_ids))]
    tokens = pack(prompts, batch.completion_ids, EOS)
    with torch.no_grad():
        scored, _ = completion_logprobs(policy.model, tokens, temperature=0.7)
    for row, got in enumerate(batch.logprobs):
        assert got.dtype == torch.float32
        want = scored[row, : len(got)]
        assert float((got - want).abs().max()) < 0.3
    forced = TorchEngine(
        policy.model, eos_token_ids=eos, pad_token_id=EOS, compute_dtype=torch.float32
    )
    again = forced.generate(PROMPTS, 3, params, generator=torch.Generator().manual_seed(3))
    for row, completion in enumerate(again.completion_ids):
        want = recomputed_logprobs(policy.model, prompts[row], completion, 0.7)
        torch.testing.assert_close(again.logprobs[row], want, rtol=0, atol=1e-4)


@pytest.mark.skipif(
    not (onednn_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU or PyTorch build has no oneDNN bfloat16 kernels",
)
@pytest.mark.parametrize("length", [8, 64], ids=["unmerged", "merged"])
def test_a_lora_base_stored_in_bf16_decodes_as_its_float32_weights_did(
    peaked_model_dir: Path, length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LoRA's base stored in the compute dtype (Policy.narrow_frozen_base) is still packed for
    oneDNN, q/k/v and gate/up as one product each. With the adapter beside the base (short
    rollouts) it samples the same tokens with the same log-probs to the bit as the float32
    weights it replaced, whose packing cast them to bfloat16. Merged into a copy (long ones),
    the sum is rounded from the bfloat16 base instead of the float32 one, so the copy may differ
    in its last bit and the samples with it: there its log-probs are no farther from the
    training forward's than the float32 base's were."""
    policy = lora_policy(peaked_model_dir, scale=0.3)
    set_compute_dtype(policy.model, torch.bfloat16)
    engine = TorchEngine(policy.model, eos_token_ids=[EOS], pad_token_id=EOS, decoder="static")
    params = SamplingParams(max_completion_length=length, temperature=0.7)
    merged = not unmerged_lora_pays(length, len(PROMPTS) * 2)
    assert merged is (length == 64)

    def sample() -> Any:
        return engine.generate(PROMPTS, 2, params, generator=torch.Generator().manual_seed(5))

    before = sample()
    assert policy.narrow_frozen_base() > 0
    packed: list[Any] = []
    original = decoders._packed
    monkeypatch.setattr(
        decoders, "_packed", lambda *a: packed.append(a[0][0].dtype) or original(*a)
    )
    engine.pack_cache = decoders.PackCache()  # the float32 weights' packs would be reused
    after = sample()
    # Every layer packed from the bfloat16 base, but a head tied to the embedding (float32).
    tied = policy.model.get_output_embeddings().weight is policy.model.get_input_embeddings().weight
    assert packed.count(torch.bfloat16) > 0 and packed.count(torch.float32) == int(tied)
    if not merged:
        assert after.completion_ids == before.completion_ids
        assert all(torch.equal(a, b) for a, b in zip(after.logprobs, before.logprobs, strict=True))
        return

    def off_training(batch: Any) -> float:
        # The training forward computes the same before and after narrowing (to the bit,
        # tests/models/test_bf16.py), so both rollouts are held against the same numbers.
        prompts = [PROMPTS[batch.prompt_index(row)] for row in range(len(batch.completion_ids))]
        with torch.no_grad():
            scored, _ = completion_logprobs(
                policy.model, pack(prompts, batch.completion_ids, EOS), temperature=0.7
            )
        rows = enumerate(batch.logprobs)
        return float(torch.cat([(got - scored[r, : len(got)]).abs() for r, got in rows]).mean())

    # Measured here (512 tokens each): 0.073 after against 0.089 before, the bfloat16 base
    # closer to the training forward (which adds the adapter to the bfloat16 base's product).
    assert off_training(after) <= 1.25 * off_training(before)


@pytest.mark.parametrize("keep_packed", [True, False])
def test_the_packed_base_is_kept_between_rollouts_only_when_asked(
    peaked_model_dir: Path, keep_packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LoRA base packed for one rollout serves the next (keep_packed, the default); without it
    (model.return_freed_memory) every rollout packs it again and keeps nothing after, and
    samples the same tokens with the same log-probs."""
    policy = lora_policy(peaked_model_dir, scale=0.3)
    params = SamplingParams(max_completion_length=8, temperature=0.7)
    packed: list[int] = []
    original = decoders._packed
    monkeypatch.setattr(decoders, "_packed", lambda *a: packed.append(1) or original(*a))

    def sample(engine: TorchEngine) -> Any:
        return engine.generate(PROMPTS, 2, params, generator=torch.Generator().manual_seed(3))

    kept = TorchEngine(policy.model, eos_token_ids=[EOS], pad_token_id=EOS, decoder="static")
    want = sample(kept)
    per_rollout = len(packed)
    assert per_rollout > 0
    engine = TorchEngine(
        policy.model,
        eos_token_ids=[EOS],
        pad_token_id=EOS,
        decoder="static",
        keep_packed=keep_packed,
    )
    assert (engine.pack_cache is not None) is keep_packed
    packed.clear()
    first, second = sample(engine), sample(engine)
    # Kept: the second rollout packs nothing of the base. Not kept: it packs all of it again.
    assert len(packed) == (per_rollout if keep_packed else 2 * per_rollout)
    for got in (first, second):
        assert got.completion_ids == want.completion_ids
        assert all(torch.equal(a, b) for a, b in zip(got.logprobs, want.logprobs, strict=True))
