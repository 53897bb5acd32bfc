"""Config loading: TRL names, batch arithmetic, and errors that name the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpokit.config import check_machine, load_config
from grpokit.errors import UserError
from grpokit.rollout.base import SamplingParams

BASE = """\
model:
  name_or_path: smollm2-135m-instruct
data:
  train: prompts.jsonl
rewards:
  - type: xml_format
training:
  learning_rate: 1.0e-4
  num_generations: 4
  per_device_train_batch_size: 1
  gradient_accumulation_steps: 4
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_seed_article_grpo_config_is_expressible(tmp_path: Path) -> None:
    # The seed article's GRPOConfig, one to one (the business-ideas recipe's config.yaml too).
    text = BASE.replace(
        "  gradient_accumulation_steps: 4\n",
        "  gradient_accumulation_steps: 4\n  num_train_epochs: 2\n  logging_steps: 1\n"
        "  num_iterations: 1\n  max_completion_length: 512\n  beta: 0.01\n  bf16: true\n"
        "  max_prompt_length: 512\n",
    )
    cfg = load_config(_write(tmp_path, text))
    t = cfg.training
    assert (t.learning_rate, t.num_generations, t.beta, t.max_completion_length) == (
        1e-4,
        4,
        0.01,
        512,
    )
    assert t.completions_per_generation == 4 and t.prompts_per_step == 1
    assert cfg.model.dtype == "bfloat16"  # bf16: true as in TRL
    assert cfg.resolve(cfg.data.train) == tmp_path / "prompts.jsonl"


def test_batch_not_divisible_by_group_says_what_to_change(tmp_path: Path) -> None:
    text = BASE.replace("gradient_accumulation_steps: 4", "gradient_accumulation_steps: 3")
    with pytest.raises(UserError) as e:
        load_config(_write(tmp_path, text))
    msg = str(e.value)
    assert "not divisible by num_generations = 4" in msg
    assert "gradient_accumulation_steps: 4" in msg
    assert "line 7" in msg  # the training: block


def test_unknown_key_names_line_and_field(tmp_path: Path) -> None:
    text = BASE.replace("  num_generations: 4\n", "  num_generations: 4\n  lerning_rate: 3\n")
    with pytest.raises(UserError) as e:
        load_config(_write(tmp_path, text))
    assert "line 10: training.lerning_rate: unknown key; did you mean 'learning_rate'?" in str(
        e.value
    )


def test_wrong_type_and_yaml_syntax(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"line 9: training.num_generations"):
        load_config(_write(tmp_path, BASE.replace("num_generations: 4", "num_generations: four")))
    with pytest.raises(UserError, match=r"config.yaml:\d+: not valid YAML"):
        load_config(_write(tmp_path, BASE + "  beta: [unclosed\n"))


def test_overrides_and_legacy_scale_rewards(tmp_path: Path) -> None:
    cfg = load_config(
        _write(tmp_path, BASE),
        ["training.beta=0.04", "training.scale_rewards=false", "rewards.0.weight=2"],
    )
    assert cfg.training.beta == 0.04
    assert cfg.training.scale_rewards == "none"
    assert cfg.rewards[0].weight == 2
    with pytest.raises(UserError, match="expected key=value"):
        load_config(_write(tmp_path, BASE), ["training.beta"])


def test_fsdp_takes_transformers_settings_and_legacy_strings(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, BASE))
    assert not cfg.training.fsdp and cfg.training.fsdp_config.reshard_after_forward
    text = BASE + "  fsdp: true\n  fsdp_config:\n    reshard_after_forward: false\n"
    fc = load_config(_write(tmp_path, text)).training.fsdp_config
    assert (fc.reshard_after_forward, fc.cpu_offload) == (False, False)
    # transformers' legacy strings, translated as TrainingArguments translates them for FSDP2.
    cases = {
        "full_shard auto_wrap": (True, True, False),
        "shard_grad_op offload": (True, False, True),
        "": (False, True, False),
    }
    for value, (on, reshard, offload) in cases.items():
        t = load_config(_write(tmp_path, BASE + f"  fsdp: '{value}'\n")).training
        assert (t.fsdp, t.fsdp_config.reshard_after_forward, t.fsdp_config.cpu_offload) == (
            on,
            reshard,
            offload,
        ), value
    # An explicit fsdp_config key wins over the string, as in transformers.
    text = BASE + "  fsdp: shard_grad_op\n  fsdp_config: {reshard_after_forward: true}\n"
    assert load_config(_write(tmp_path, text)).training.fsdp_config.reshard_after_forward


def test_fsdp_errors_name_the_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"line 12: training.fsdp: unknown FSDP option 'hybrid'"):
        load_config(_write(tmp_path, BASE + "  fsdp: full_shard hybrid\n"))
    with pytest.raises(UserError, match="line 12: training.fsdp: choose one of full_shard"):
        load_config(_write(tmp_path, BASE + "  fsdp: full_shard shard_grad_op\n"))
    with pytest.raises(
        UserError, match=r"line 13: training.fsdp_config.version: Input should be 2"
    ):
        load_config(_write(tmp_path, BASE + "  fsdp: true\n  fsdp_config: {version: 1}\n"))
    with pytest.raises(UserError, match="line 7: training: fsdp and use_vllm cannot be combined"):
        load_config(_write(tmp_path, BASE + "  fsdp: true\n  use_vllm: true\n"))


def test_missing_file_and_unknown_reward_type(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="xml_formt"):
        load_config(_write(tmp_path, BASE.replace("type: xml_format", "type: xml_formt")))


def test_every_field_has_a_description() -> None:
    from pydantic import BaseModel

    from grpokit.config import GRPOKitConfig

    seen: set[type] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            ann = field.annotation
            for arg in getattr(ann, "__args__", ()) + (ann,):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    walk(arg)

    walk(GRPOKitConfig)
    assert len(seen) >= 5


def test_numbers_must_be_finite_and_keys_unique(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"config.yaml:8: training.learning_rate: .inf is not a "):
        load_config(_write(tmp_path, BASE.replace("1.0e-4", ".inf")))
    with pytest.raises(UserError, match=r"config.yaml:7: rewards.0.weight: .NaN is not a finite"):
        load_config(_write(tmp_path, BASE.replace("xml_format", "xml_format\n    weight: .NaN")))
    with pytest.raises(UserError, match=r"training.beta=.nan': .nan is not a finite number"):
        load_config(_write(tmp_path, BASE), ["training.beta=.nan"])
    with pytest.raises(UserError, match=r"line 7: training.beta: Input should be a finite number"):
        load_config(_write(tmp_path, BASE), ["training.beta=nan"])  # the string "nan"
    # PyYAML keeps the last of two equal keys silently; the config refuses them.
    with pytest.raises(UserError, match=r"config.yaml:12: training.num_generations is given twice"):
        load_config(_write(tmp_path, BASE + "  num_generations: 8\n"))


def test_config_encoding(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_bytes(("# réglages\n" + BASE).encode("latin-1"))
    with pytest.raises(UserError, match=r"config.yaml: not UTF-8 text: byte 0xe9 at offset 3 "):
        load_config(p)
    p.write_bytes(b"\xef\xbb\xbf" + BASE.encode())  # a byte-order mark is fine
    assert load_config(p).training.num_generations == 4


def test_set_into_a_value_or_past_a_list_says_where(tmp_path: Path) -> None:
    config = _write(tmp_path, BASE)
    with pytest.raises(UserError, match=r"model.name_or_path is a value \('smollm2-135m-instruct'"):
        load_config(config, ["model.name_or_path.a.b=1"])
    with pytest.raises(UserError, match=r"rewards is a list of 1; '3' is not one of its indexes"):
        load_config(config, ["rewards.3.weight=1"])


def test_trl_reward_weights_replace_each_rewards_weight(tmp_path: Path) -> None:
    text = BASE.replace(
        "  - type: xml_format\n",
        "  - type: xml_format\n  - type: length_penalty\n    free_length: 10\n",
    )
    cfg = load_config(_write(tmp_path, text), ["training.reward_weights=[0.5, 2]"])
    assert [r.weight for r in cfg.rewards] == [0.5, 2.0]
    with pytest.raises(
        UserError, match=r"reward_weights has 3 weight\(s\) but there are 2 rewards"
    ):
        load_config(_write(tmp_path, text), ["training.reward_weights=[1, 1, 1]"])


def test_trl_forms_of_settings(tmp_path: Path) -> None:
    cfg = load_config(
        _write(tmp_path, BASE),
        ["training.report_to=wandb", "training.warmup_steps=0.25", "training.eval_steps=5"],
    )
    t = cfg.training
    assert (t.report_to, t.warmup_ratio, t.warmup_steps) == (["wandb"], 0.25, 0)
    assert (t.eval_strategy, t.eval_interval) == ("steps", 5)
    assert t.save_interval(steps_per_epoch=3) == 500
    t.save_strategy = "epoch"
    assert t.save_interval(steps_per_epoch=3) == 3
    t.save_strategy = "no"
    assert t.save_interval(steps_per_epoch=3) == 0
    assert t.sampling_params == SamplingParams(
        max_completion_length=t.max_completion_length,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
    )


def test_generation_kwargs_override_the_sampling_fields_as_floats_and_ints() -> None:
    from grpokit.config import TrainingConfig

    # TRL's precedence: generation_kwargs over the fields; their values are kept as written
    # (an int temperature, a text top_p, a null top_k or min_p) and cast into SamplingParams.
    t = TrainingConfig(
        temperature=0.9,
        top_k=5,
        min_p=0.1,
        max_completion_length=64,
        generation_kwargs={"temperature": 1, "top_p": "0.5", "top_k": None, "min_p": None},
    )
    assert t.sampling_params == SamplingParams(
        max_completion_length=64, temperature=1.0, top_p=0.5, top_k=0, min_p=0.0
    )
    assert isinstance(t.sampling_params.temperature, float)
    assert TrainingConfig(top_k=None).sampling_params.top_k == 0


def test_device_is_checked_by_name_and_on_this_machine(tmp_path: Path) -> None:
    import torch

    with pytest.raises(UserError, match="model.device: 'tpu' is not a device grpokit runs on"):
        load_config(_write(tmp_path, BASE), ["model.device=tpu"])
    cfg = load_config(_write(tmp_path, BASE), ["model.device=cuda"])  # loads anywhere
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="model.device 'cuda': this machine has no CUDA"):
            check_machine(cfg)


def test_heldout_watch_must_name_a_reward(tmp_path: Path) -> None:
    text = BASE + "monitors:\n  heldout: {watch: [xml_format]}\n"
    assert load_config(_write(tmp_path, text)).monitors.heldout.watch == ["xml_format"]
    with pytest.raises(UserError) as e:
        load_config(_write(tmp_path, text.replace("[xml_format]", "[quality]")))
    assert "monitors.heldout.watch names 'quality', not a reward of this config" in str(e.value)
    assert "rewards: xml_format" in str(e.value)


def test_generating_ahead_says_what_it_needs(tmp_path: Path) -> None:
    server = "  use_vllm: true\n  vllm_mode: server\n"
    load_config(_write(tmp_path, BASE + server + "  max_staleness: 1\n"))
    for extra, why in [
        ("", "needs use_vllm: true with vllm_mode: server"),
        ("  use_vllm: true\n", "needs use_vllm: true with vllm_mode: server"),
        (server + "  vllm_importance_sampling_correction: false\n", "samples from an older"),
        (server + "  dynamic_sampling: true\n", "takes rounds of one size"),
    ]:
        with pytest.raises(UserError, match=f"training: max_staleness: 2 {why}.*max_staleness: 0"):
            load_config(_write(tmp_path, BASE + extra + "  max_staleness: 2\n"))


def test_steps_per_generation_follows_trls_batch_arithmetic() -> None:
    """TRL's resolution (steps_per_generation from generation_batch_size, or gradient
    accumulation) and rules, and grpokit's whole number of optimizer steps per generation."""
    from pydantic import ValidationError

    from grpokit.config import TrainingConfig

    base = {"num_generations": 4, "per_device_train_batch_size": 4, "num_processes": 2}
    t = TrainingConfig(**base)
    assert (t.micro_batches_per_generation, t.completions_per_generation) == (1, 8)
    assert t.updates_per_round == 1
    t = TrainingConfig(**base, gradient_accumulation_steps=2, generation_batch_size=32)
    assert (t.micro_batches_per_generation, t.updates_per_generation, t.prompts_per_step) == (
        4,
        2,
        8,
    )
    t = TrainingConfig(**base, steps_per_generation=3, num_iterations=2)
    assert (t.completions_per_generation, t.updates_per_round) == (24, 6)
    # a TRL dump holds both, resolved: the same setting
    both = TrainingConfig(**base, steps_per_generation=3, generation_batch_size=24)
    assert both.updates_per_generation == 3
    for bad, says in [
        ({"steps_per_generation": 3, "generation_batch_size": 16}, "cannot both be set"),
        ({"generation_batch_size": 12}, "not divisible by per_device_train_batch_size"),
        ({"steps_per_generation": 3, "gradient_accumulation_steps": 2}, "multiple of gradient"),
        ({"steps_per_generation": 1, "per_device_train_batch_size": 1}, "num_generations"),
        ({"cast_lm_head_to_fp32": True, "fsdp": True}, "cast_lm_head_to_fp32"),
    ]:
        with pytest.raises(ValidationError, match=says):
            TrainingConfig(**(base | bad))
