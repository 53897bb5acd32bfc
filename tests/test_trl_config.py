"""TRL's GRPOConfig field by field: accepted with TRL's meaning and default, or refused with a
reason; docs/trl.md generated from the same table."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

trl = pytest.importorskip("trl")

from grpokit.config import TrainingConfig, load_config  # noqa: E402
from grpokit.config_docs import help_text, training_groups, trl_markdown  # noqa: E402
from grpokit.errors import UserError  # noqa: E402
from grpokit.trl_fields import (  # noqa: E402
    DEFAULT_DIFFERS,
    GRPOKIT_ONLY,
    TRL_FIELDS,
    TRL_SCRIPT_KEYS,
)

REPO = Path(__file__).resolve().parents[1]
TRL_DEFAULTS: dict[str, Any] = {
    f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    for f in dataclasses.fields(trl.GRPOConfig)
}


def _config(tmp_path: Path, training: dict[str, Any], **top: Any) -> Path:
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1?"}\n')
    doc = {
        "data": {"train": "p.jsonl"},
        "rewards": [{"type": "xml_format"}, {"type": "regex_match", "pattern": "[0-9]"}],
        "training": {"num_generations": 2, "per_device_train_batch_size": 2, **training},
        **top,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _other_value(default: Any) -> Any:
    """A value of the same kind as ``default`` that differs from it."""
    if isinstance(default, bool):
        return not default
    if default is None:
        return "something"
    if isinstance(default, int | float):
        return default + 7
    if isinstance(default, str):
        return default + "-other"
    if isinstance(default, list):
        return ["x"]
    return {"x": 1}


def test_every_trl_field_is_accepted_or_has_its_reason() -> None:
    ours = set(TrainingConfig.model_fields) - set(GRPOKIT_ONLY)
    for name in TRL_DEFAULTS:
        assert (name in ours) != (name in TRL_FIELDS), f"{name}: implemented xor in the table"
    assert set(TRL_FIELDS) <= set(TRL_DEFAULTS), "the table names fields TRL does not have"
    assert ours <= set(TRL_DEFAULTS), "a grpokit-only training field is missing in GRPOKIT_ONLY"
    for field in TRL_FIELDS.values():
        assert field.reason, field.name
        assert field.default == TRL_DEFAULTS[field.name], f"{field.name}: TRL's default changed"


def test_implemented_fields_take_trl_default_or_say_why_not() -> None:
    default = TrainingConfig()
    for name in set(TrainingConfig.model_fields) - set(GRPOKIT_ONLY):
        # TRL's default, given to grpokit, must give grpokit's default (None/False for fsdp...).
        try:
            given: Any = getattr(TrainingConfig.model_validate({name: TRL_DEFAULTS[name]}), name)
        except ValidationError:
            given = "(refused)"
        same = given == getattr(default, name)
        assert same != (name in DEFAULT_DIFFERS), (
            f"{name}: TRL's default {TRL_DEFAULTS[name]!r} gives {given!r}, grpokit's is "
            f"{getattr(default, name)!r}; match it, or say why not in DEFAULT_DIFFERS"
        )
    assert default.adam_beta2 == 0.999 and default.optim == "adamw_torch_fused"


def test_trl_fields_at_trl_defaults_are_accepted_and_change_nothing(tmp_path: Path) -> None:
    accepted = {n: TRL_DEFAULTS[n] for n, f in TRL_FIELDS.items() if f.accepts(TRL_DEFAULTS[n])}
    assert len(accepted) > 100
    plain = load_config(_config(tmp_path, {})).training
    dumped = load_config(_config(tmp_path, accepted)).training
    assert dumped == plain


def test_other_values_are_refused_naming_the_field_and_the_reason(tmp_path: Path) -> None:
    for name, field in TRL_FIELDS.items():
        # A value grpokit does not take (for a few fields that is TRL's default itself).
        value = next(
            (v for v in (_other_value(field.default), field.default) if not field.accepts(v)),
            _other_value(field.default),
        )
        if field.status == "ignored":
            load_config(_config(tmp_path, {name: value}))
            continue
        with pytest.raises(UserError) as e:
            load_config(_config(tmp_path, {name: value}))
        msg = str(e.value)
        assert f"training.{name}: TRL's {name} is not supported ({field.reason}" in msg, msg
        assert "line " in msg


def test_a_trl_users_config_runs_unchanged(tmp_path: Path) -> None:
    # What a TRL user passes to GRPOConfig(...), as YAML under training:.
    settings: dict[str, Any] = {
        "output_dir": "out",
        "learning_rate": 1e-5,
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "max_completion_length": 64,
        "temperature": 0.9,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "beta": 0.04,
        "loss_type": "dr_grpo",
        "scale_rewards": False,
        "optim": "adamw_torch",
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "logging_steps": 5,
        "save_strategy": "steps",
        "save_steps": 50,
        "report_to": "none",
        "reward_weights": [0.5, 2.0],
        "chat_template_kwargs": {"enable_thinking": False},
        "generation_kwargs": {"top_k": 20},
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "warmup_steps": 0.1,
        "eval_strategy": "steps",
        "push_to_hub": False,
        "bf16": False,
        "activation_checkpointing": True,
        "dataloader_num_workers": 4,
        "log_level": "info",
    }
    trl.GRPOConfig(**settings)  # TRL itself takes them
    cfg = load_config(_config(tmp_path, settings))
    t = cfg.training
    assert (t.learning_rate, t.min_p, t.repetition_penalty, t.scale_rewards) == (
        1e-5,
        0.05,
        1.1,
        "none",
    )
    assert t.report_to == ["none"]
    assert [r.weight for r in cfg.rewards] == [0.5, 2.0]
    assert t.optimizer_kwargs == {
        "lr": 1e-5,
        "betas": (0.9, 0.98),
        "eps": 1e-8,
        "weight_decay": 0.0,
        "fused": False,
    }
    assert t.sampling_params.top_k == 20 and t.sampling_params.min_p == 0.05
    assert (t.warmup_ratio, t.warmup_steps) == (0.1, 0)
    assert cfg.model.gradient_checkpointing
    assert t.eval_interval == 5  # eval_steps defaults to logging_steps, as in transformers
    assert t.save_interval(steps_per_epoch=7) == 50


def test_trl_keys_in_the_wrong_place_say_where_they_go(tmp_path: Path) -> None:
    for key, where in (
        ("model_name_or_path", "model.name_or_path"),
        ("dataset_name", "data.train"),
    ):
        with pytest.raises(
            UserError, match=f"{key}: a TRL script argument; in grpokit it is {where}"
        ):
            load_config(_config(tmp_path, {}, **{key: "x"}))
    assert set(TRL_SCRIPT_KEYS) >= {"model_name_or_path", "dataset_name", "dataset_train_split"}
    with pytest.raises(
        UserError, match="learning_rate: a training setting: put it under training:"
    ):
        load_config(_config(tmp_path, {}, learning_rate=1e-5))


def test_training_fields_are_grouped_in_help_and_docs() -> None:
    groups = training_groups()
    assert list(groups) == [
        "generation",
        "loss",
        "optimisation",
        "checkpointing",
        "logging",
        "distribution",
    ]
    assert sorted(n for names in groups.values() for n in names) == sorted(
        TrainingConfig.model_fields
    )
    text = help_text()
    assert text.index("training: (generation)") < text.index("training: (distribution)")
    assert "  min_p: float | null = null" in text


def test_docs_trl_md_is_generated_from_the_table() -> None:
    on_disk = (REPO / "docs" / "trl.md").read_text(encoding="utf-8")
    assert on_disk == trl_markdown(), (
        "docs/trl.md is out of date: python -m grpokit.config_docs docs/trl.md"
    )
    for name in TRL_DEFAULTS:
        assert f"| {name} |" in on_disk, name


def test_help_texts_point_only_to_documents_that_exist() -> None:
    import re

    from grpokit.config_docs import _sections

    for _, model in _sections():
        for name, field in model.model_fields.items():
            for doc in re.findall(r"\b[\w./-]+\.(?:md|py)\b", field.description or ""):
                assert (REPO / doc).exists(), f"{model.__name__}.{name} refers to {doc}"
            assert "docs:" not in (field.description or ""), f"{model.__name__}.{name}"


def test_trl_best_model_and_multi_objective_settings_carry_over(tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "multi_objective_aggregation": "normalize_then_sum",
        "eval_strategy": "steps",
        "eval_steps": 10,
        "save_steps": 20,
        "save_total_limit": 1,
        "metric_for_best_model": "eval_rewards/regex_match/mean",
        "greater_is_better": True,
        "load_best_model_at_end": True,
    }
    trl.GRPOConfig(output_dir="out", bf16=False, **settings)  # TRL itself takes them
    (tmp_path / "h.jsonl").write_text('{"prompt": "2+2?"}\n')
    path = _config(tmp_path, settings)
    doc = yaml.safe_load(path.read_text())
    doc["data"]["heldout"] = "h.jsonl"
    path.write_text(yaml.safe_dump(doc))
    t = load_config(path).training
    assert t.multi_objective_aggregation == "normalize_then_sum"
    assert (t.best_metric, t.best_is_greater, t.load_best_model_at_end) == (
        "eval/regex_match/mean",
        True,
        True,
    )
    # TRL refuses save steps that are not a multiple of the eval steps; so does grpokit.
    with pytest.raises(ValueError, match="multiple of the evaluation"):
        trl.GRPOConfig(output_dir="out", bf16=False, **{**settings, "save_steps": 15})
    with pytest.raises(UserError, match="save_steps 15 is not a multiple of eval_steps 10"):
        load_config(_config(tmp_path, {**settings, "save_steps": 15}))
