"""The GRPO loop end to end on a tiny random model: every variant runs, learns, logs and resumes."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from grpokit.config import GRPOKitConfig
from grpokit.train.rollout_record import TrainBatch
from grpokit.train.run import resume_run
from grpokit.train.step_metrics import step_summary
from grpokit.train.trainer import GRPOTrainer

TRL_METRICS = {
    "reward",
    "reward_std",
    "rewards/e/mean",
    "rewards/e/std",
    "frac_reward_zero_std",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "num_tokens",
    "step_time",
    "learning_rate",
    "grad_norm",
    "loss",
    "time/generate",
    "time/score",
    "time/update",
}


def _params(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad
    }


@pytest.mark.parametrize(
    ("model", "training"),
    [
        ({}, {"beta": 0.0, "loss_type": "dapo"}),
        ({}, {"beta": 0.04, "loss_type": "grpo", "num_iterations": 2}),
        ({"lora": {"r": 4, "alpha": 8}}, {"beta": 0.04, "loss_type": "bnpo"}),
        (
            {"lora": {"r": 4, "alpha": 8}},
            {"beta": 0.0, "loss_type": "dr_grpo", "num_iterations": 2},
        ),
        (
            {},
            {
                "importance_sampling_level": "sequence",
                "scale_rewards": "batch",
                "advantage_estimator": "rloo",
            },
        ),
    ],
    ids=["full-dapo-beta0", "full-grpo-kl-mu2", "lora-bnpo-kl", "lora-drgrpo-mu2", "gspo-rloo"],
)
def test_variants_train_and_log(
    make_config: Callable[..., GRPOKitConfig], model: dict, training: dict
) -> None:
    cfg = make_config(model=model, **training)
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    before = _params(trainer)
    result = trainer.train()
    mu = training.get("num_iterations", 1)
    assert result.global_step == 2
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert set(lines[0]) >= TRL_METRICS, TRL_METRICS - set(lines[0])
    assert 0 < lines[0]["memory/max_rss_gib"] <= lines[1]["memory/max_rss_gib"]  # peak so far
    assert ("kl" in lines[0]) == (training.get("beta", 0.0) > 0)
    assert all(math.isfinite(x["loss"]) and math.isfinite(x["grad_norm"]) for x in lines)
    after = _params(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before), "no parameter changed"
    if "lora" in model:
        assert all("lora_" in n for n in before)
    # mu > 1: the second pass is off-policy, the ratio moves away from 1, the clip metrics can fire
    assert len(lines) == 2 and (mu == 1 or lines[0]["num_tokens"] == lines[1]["num_tokens"])
    ckpt = result.checkpoint
    assert ckpt is not None and (ckpt / "trainable.safetensors").is_file()
    assert (result.run_dir / "versions.json").is_file() and (
        result.run_dir / "config.yaml"
    ).is_file()
    completions = (result.run_dir / "completions.jsonl").read_text().splitlines()
    assert completions and {
        "step",
        "prompt",
        "completion",
        "reward",
        "rewards",
        "advantage",
    } <= set(json.loads(completions[0]))


@pytest.mark.parametrize(
    "training",
    [{"loss_type": "cispo", "epsilon_high": 5.0}, {"loss_type": "sapo", "num_iterations": 2}],
    ids=["cispo", "sapo-mu2"],
)
def test_registered_losses_train_and_log_their_metrics(
    make_config: Callable[..., GRPOKitConfig], training: dict
) -> None:
    trainer = GRPOTrainer(make_config(**training), progress=False, log=lambda m: None)
    before = _params(trainer)
    result = trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in _params(trainer).items())
    record = result.history[0]
    assert math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"])
    metric = "cispo_clip_ratio" if training["loss_type"] == "cispo" else "sapo/gate_mean"
    assert 0.0 <= record[metric] <= 1.0
    # The torch engine samples with the trainer's own weights and dtype: the sampler/trainer gap
    # is measured and is float32 rounding, far from any correction's range.
    assert 0.0 <= record["mismatch/kl"] < 1e-4
    assert record["mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-2)
    assert "mismatch/masked_frac" not in record  # corrected only for vLLM


def test_masking_truncated_completions_removes_them_from_the_loss(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    # max_completion_length 8 truncates every completion of the random model: nothing to learn.
    trainer = GRPOTrainer(
        make_config(mask_truncated_completions=True), progress=False, log=lambda m: None
    )
    before = _params(trainer)
    result = trainer.train()
    assert result.history[0]["completions/clipped_ratio"] == 1.0
    assert all(h["loss"] == 0.0 and h["grad_norm"] == 0.0 for h in result.history)
    assert all(torch.equal(before[n], p) for n, p in _params(trainer).items())


def test_a_round_without_signal_still_counts_num_iterations_steps(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    # Every group has equal rewards, so no round updates; each round must still count its
    # num_iterations = 2 steps, as total_steps and the learning-rate schedule assume.
    cfg = make_config(
        rewards=[{"type": "python", "name": "c", "function": "my_rewards.py:constant"}],
        num_iterations=2,
        max_steps=-1,
        num_train_epochs=1,
        lr_scheduler_type="linear",
    )
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    assert trainer.total_steps == 2 * 4  # 8 prompts, 2 per round, 2 steps a round
    result = trainer.train()
    assert result.global_step == trainer.total_steps
    assert [h["step"] for h in result.history] == list(range(1, 9))
    assert all(h["frac_reward_zero_std"] == 1.0 and h["loss"] == 0.0 for h in result.history)
    # The linear schedule reached its end exactly when the run did.
    assert result.history[-1]["learning_rate"] == 0.0
    # One pass over the 8 prompts in 4 generation rounds, not two passes in 8 rounds.
    assert trainer.state.generation_round == 4
    assert result.history[-1]["epoch"] == pytest.approx(1.0)


def test_off_a_terminal_every_step_prints_a_line_with_the_generation_speed(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    """In a log (CI, nohup) a line per step, not only every logging_steps; each names the
    tokens per second generated, which metrics.jsonl holds as generate/tokens_per_second."""
    lines: list[str] = []
    cfg = make_config(max_steps=3, logging_steps=50)
    trainer = GRPOTrainer(cfg, progress=True, log=lines.append)
    assert not trainer.live_bar  # pytest captures stderr: not a terminal
    result = trainer.train()
    steps = [x for x in lines if x.startswith("step ")]
    assert [x.split(":")[0] for x in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all(" tok/s" in x for x in steps)
    for record in result.history:
        rate, seconds = record["generate/tokens_per_second"], record["time/generate"]
        # The completion tokens sampled (prompts_per_step x G of them) over the rollout time.
        completions = cfg.training.prompts_per_step * cfg.training.num_generations
        assert rate * seconds == pytest.approx(record["completions/mean_length"] * completions)
        assert f"step {record['step']}/3: {step_summary(record)}" in steps[record["step"] - 1]


def test_the_end_of_run_hint_names_eval_steps_alone_when_the_heldout_set_is_there(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    """data.heldout is set; eval_steps 5 > the 2 steps run: no held-out check, and the forecast
    line says why without asking for data.heldout."""
    lines: list[str] = []
    format_reward = {"type": "xml_format", "name": "format", "tags": ["answer"]}  # has a maximum
    cfg = make_config(rewards=[format_reward], eval_steps=5)
    assert cfg.data.heldout is not None
    GRPOTrainer(cfg, progress=False, log=lines.append).train()
    (line,) = [x for x in lines if x.startswith("  format: pass rate")]
    assert line.endswith(
        "; no held-out check logged (the held-out eval runs every 5 steps "
        "(training.eval_steps), more than the run's 2: set training.eval_steps to at most 2)"
    )


def test_resume_continues_exactly_like_an_uninterrupted_run(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    full = GRPOTrainer(
        make_config(max_steps=4, output_dir="full"), progress=False, log=lambda m: None
    ).train()
    # The same run, stopped after 2 steps (max_steps 2 of a 4-step schedule), then resumed.
    cfg = make_config(max_steps=4, output_dir="split", save_steps=2)
    first = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    first.total_steps = 2  # stop early, as a kill after the step-2 checkpoint would
    first.train()
    assert (tmp_path / "split" / "checkpoint-2" / "trainable.safetensors").is_file()
    resumed = resume_run(tmp_path / "split", progress=False)
    assert resumed.global_step == 4
    a = [json.loads(x) for x in (full.run_dir / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (resumed.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in b] == [1, 2, 3, 4]
    for x, y in zip(a, b, strict=True):
        for key in ("reward", "loss", "grad_norm", "completions/mean_length", "learning_rate"):
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-7), (x["step"], key)


def test_resumed_run_monitors_remember_the_steps_before_the_checkpoint(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path
) -> None:
    def config(**training: Any) -> GRPOKitConfig:
        cfg = make_config(max_steps=4, **training)
        # Fires at step 1 (a group's most common text fills at least 1/G of it) and its episode
        # never ends: a monitor that forgot the steps before a resume would fire again.
        cfg.monitors.group_dominance.max_duplicate_frac = 0.01
        cfg.monitors.group_dominance.smooth_steps = 1
        return cfg

    def alerts(run_dir: Path) -> list[tuple[int, str]]:
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], a["rule"]) for r in rows for a in r.get("alerts", [])]

    full = GRPOTrainer(config(output_dir="full"), progress=False, log=lambda m: None).train()
    first = GRPOTrainer(
        config(output_dir="split", save_steps=2), progress=False, log=lambda m: None
    )
    first.total_steps = 2
    first.train()
    resumed = resume_run(tmp_path / "split", progress=False)
    assert (1, "group_dominance") in alerts(full.run_dir)
    assert alerts(resumed.run_dir) == alerts(full.run_dir)


def test_periodic_heldout_eval_and_dynamic_sampling(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    cfg = make_config(eval_steps=1, eval_samples=2, dynamic_sampling=True)
    result = GRPOTrainer(cfg, progress=False, log=lambda m: None).train()
    assert "eval/e/mean" in result.history[0] and "eval/reward" in result.history[0]
    # The standard error over held-out prompts, which the heldout monitor tests drops against.
    assert result.history[0]["eval/e/stderr"] >= 0 and result.history[0]["eval/reward/stderr"] >= 0


def test_reference_log_probs_scored_in_the_rollout_train_as_the_trainers_forward(
    make_config: Callable[..., GRPOKitConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LoRA with beta > 0: the engine scores the sampled tokens under the base as it generates
    them, the reference forward before the update never runs, and the run follows one that
    computes them in that forward (``ref_logprobs_in_rollout: false``) to float32 rounding. The
    log-probs agree within 2e-4 (the decoders' logits are within 1e-4 of the forward's, see
    test_decoders, and a log-softmax moves by at most twice its logits' largest change), and the
    three steps' KL, loss and gradient norm as closely (measured: 1e-6 and 1e-9). The weights
    themselves are not compared: Adam's step on a gradient near zero can take either sign."""
    lora = {"lora": {"r": 4, "alpha": 8}}
    runs: dict[bool, list[dict[str, Any]]] = {}
    for in_rollout in (True, False):
        cfg = make_config(
            model=lora,
            beta=0.04,
            max_steps=3,
            learning_rate=2e-2,
            ref_logprobs_in_rollout=in_rollout,
            output_dir=f"run-{in_rollout}",
        )
        trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
        assert getattr(trainer.engine, "reference_logprobs", None) is in_rollout
        if in_rollout:
            _check_reference_from_the_engine(trainer, monkeypatch)
            trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)

            def no_reference_forward() -> None:
                raise AssertionError("the reference forward ran")

            monkeypatch.setattr(trainer.policy, "reference_model", no_reference_forward)
        result = trainer.train()
        lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
        runs[in_rollout] = lines
    scored, forward = runs[True], runs[False]
    assert [x["num_tokens"] for x in scored] == [x["num_tokens"] for x in forward]
    assert forward[-1]["kl"] > 1e-3  # the policy has moved away from the reference
    for a, b in zip(scored, forward, strict=True):
        # k3 = e^x - x - 1 of x = ref - logp moves by |e^x - 1| <= 1 times x's change (x < log
        # 2 here), the loss by beta times that.
        assert a["kl"] == pytest.approx(b["kl"], abs=2e-4)
        assert a["loss"] == pytest.approx(b["loss"], abs=0.04 * 2e-4)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


def _check_reference_from_the_engine(trainer: GRPOTrainer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The held-out check decodes without the reference rows (it needs no reference log-probs);
    after a step has trained the adapter, the engine's reference log-probs of a round are the
    trainer's reference forward's, and not the policy's."""
    engine: Any = trainer.engine
    during: list[bool] = []
    generate = engine.generate

    def spy(*args: Any, **kwargs: Any) -> Any:
        during.append(engine.reference_logprobs)
        return generate(*args, **kwargs)

    monkeypatch.setattr(engine, "generate", spy)
    assert trainer.heldout_metrics()
    assert during == [False] and engine.reference_logprobs
    trainer.step()
    assert during[-1]
    exp = trainer.collect()
    assert exp is not None and exp.ref_logps is not None
    batch = exp.train_batch(slice(0, len(exp)), trainer.pad_token_id)
    with torch.no_grad():
        want = trainer.frozen_logprobs(trainer.policy.reference_model(), [batch])[0]
        model = contextlib.nullcontext(trainer.policy.model)
        policy = trainer.frozen_logprobs(model, [batch])[0]
    got = batch.ref_logps
    assert want is not None and got is not None and policy is not None
    mask = batch.tokens.completion_mask.bool()
    assert float((got - want)[mask].abs().max()) < 2e-4
    assert float((policy - want)[mask].abs().max()) > 1e-2  # the adapter is on


@pytest.mark.parametrize("truncated", [True, False], ids=["truncated", "full-softmax"])
def test_top_p_and_top_k_ratios_on_the_distribution_drawn_from(
    make_config: Callable[..., GRPOKitConfig], truncated: bool
) -> None:
    """top_p 0.9 and top_k 20 on the torch engine: the engine reports log-probs of the truncated
    distribution. The trainer scoring the same (the default) leaves float32 rounding between
    sampler and trainer and an old/current ratio of exactly 1 on-policy; scoring the full softmax
    (truncated_logprobs: false, what the trainer did before) puts log S into every ratio."""
    cfg = make_config(
        top_p=0.9, top_k=20, beta=0.04, num_iterations=2, max_steps=1,
        truncated_logprobs=truncated,
    )  # fmt: skip
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    exp = trainer.collect()
    assert exp is not None
    batch = exp.train_batch(slice(0, len(exp)), trainer.pad_token_id).to(trainer.device)
    mask = batch.tokens.completion_mask.bool()
    with torch.no_grad():
        old = trainer.frozen_logprobs(contextlib.nullcontext(trainer.policy.model), [batch])[0]
    logp, _, log_kept = trainer._logprobs(trainer.policy.model, batch.tokens, with_entropy=True)
    sampler = batch.sampler_logps
    assert old is not None and sampler is not None
    gap = (sampler.to(logp.device) - logp.detach())[mask]
    if truncated:
        assert log_kept is not None and float(log_kept[mask].max()) < -1.0  # S well below 1
        assert torch.equal(old[mask], logp.detach()[mask])  # the ratio is exactly 1 on-policy
        assert float(gap.abs().max()) < 1e-4
    else:
        assert log_kept is None
        assert float(gap.min()) > 1.0  # every token's sampler log-prob exceeds by -log S
    record = trainer.train().history[0]
    if truncated:
        assert 0.0 <= record["mismatch/kl"] < 1e-6
        assert record["mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-3)
        assert 0.0 < record["sampling/kept_mass"] < 0.05
        assert record["kl"] == pytest.approx(0.0, abs=1e-6)  # on the full softmax: policy = ref
        assert record["clip_ratio/region_mean"] == 0.0
    else:
        assert record["mismatch/kl"] > 1.0 and record["mismatch/max_ratio"] < 0.05
        assert "sampling/kept_mass" not in record


def test_off_policy_stabilisers_train_and_log(make_config: Callable[..., GRPOKitConfig]) -> None:
    """TRL's off_policy_mask_threshold and use_bias_correction_kl through the trainer, two passes
    per generation: the mask is measured every step and drops nothing on the first pass (the torch
    engine samples with the trainer's weights: its log-ratio is rounding, far below 0.5)."""
    cfg = make_config(
        beta=0.04, num_iterations=2, off_policy_mask_threshold=0.5, use_bias_correction_kl=True
    )
    assert cfg.training.loss_settings.use_bias_correction_kl
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    before = _params(trainer)
    result = trainer.train()
    assert result.global_step == 2
    assert any(not torch.equal(before[n], p) for n, p in _params(trainer).items())
    first, second = result.history
    assert first["off_policy_mask/masked_frac"] == 0.0
    assert 0.0 <= second["off_policy_mask/masked_frac"] <= 1.0
    assert all(math.isfinite(h["loss"]) and h["kl"] >= 0.0 for h in result.history)


def test_steps_per_generation_takes_several_steps_on_slices_of_one_generation(
    make_config: Callable[..., GRPOKitConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """steps_per_generation 4 with gradient_accumulation_steps 2: one generation of 4 x 4 = 16
    completions (4 prompts) feeds 2 optimizer steps of 8, each on its own slice; with
    num_iterations 2, the slices in turn twice. 8 prompts, one epoch: 2 generations, 8 steps."""
    cfg = make_config(steps_per_generation=4, num_iterations=2, max_steps=-1, num_train_epochs=1)
    assert cfg.training.completions_per_generation == 16 and cfg.training.prompts_per_step == 4
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    assert trainer.total_steps == 8
    assert trainer.loss.needs.old_logp  # pi_old is taken apart from the first step on
    seen: list[tuple[tuple[int, ...], int]] = []
    own = trainer._loss_and_backward

    def recording(batch: TrainBatch, *args: Any) -> None:
        seen.append((tuple(batch.tokens.input_ids.flatten().tolist()), len(batch)))
        own(batch, *args)

    monkeypatch.setattr(trainer, "_loss_and_backward", recording)
    result = trainer.train()
    assert result.global_step == 8 and trainer.state.generation_round == 2
    assert [h["step"] for h in result.history] == list(range(1, 9))
    # 8 rows per step (2 micro-batches of 4), slice a, b, a, b per generation
    per_step = [seen[i : i + 2] for i in range(0, len(seen), 2)]
    assert len(per_step) == 8 and all(len(s) == 2 and s[0][1] == s[1][1] == 4 for s in per_step)
    a, b, a2, b2 = per_step[:4]
    assert not set(a) & set(b) and (a, b) == (a2, b2)
    assert all(math.isfinite(h["loss"]) for h in result.history)


def test_cast_lm_head_to_fp32_in_a_bfloat16_model(
    make_config: Callable[..., GRPOKitConfig],
) -> None:
    """The tiny model's head is tied to its embedding: both become float32, the embedding's
    output stays bfloat16, the logits are float32, and a few steps train."""
    from grpokit.models.fp32_head import Float32Head

    cfg = make_config(model={"dtype": "bfloat16"}, cast_lm_head_to_fp32=True, beta=0.04)
    trainer = GRPOTrainer(cfg, progress=False, log=lambda m: None)
    inner = trainer.policy.model
    head = inner.get_output_embeddings()
    assert isinstance(head, Float32Head) and head.weight.dtype == torch.float32
    assert inner.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert inner.get_input_embeddings()(ids).dtype == torch.bfloat16
        assert inner(input_ids=ids).logits.dtype == torch.float32
    result = trainer.train()
    assert result.global_step == 2
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"]) for h in result.history)
