"""The whole config: model, data, rewards, training and monitors, and what ties them together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from grpokit.config.sections import DataConfig, ModelConfig, ToolSpec, _Strict
from grpokit.config.training import TrainingConfig
from grpokit.errors import read_utf8
from grpokit.monitor.config import MonitorConfig
from grpokit.rewards.builtin.python_fn import FUNCTION_PATH
from grpokit.rewards.spec import RewardSpec, validate_reward_specs

_TRL_NAMES = {"dtype": "bf16", "gradient_checkpointing": "gradient_checkpointing"}
"""model: settings that TRL keeps under training: (by its names there)."""


class GRPOKitConfig(_Strict):
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    data: DataConfig = Field(description="Prompt sets and the system prompt.")
    rewards: list[RewardSpec] = Field(
        min_length=1, description="Reward functions, their weights and gates."
    )
    tools: list[str | ToolSpec] = Field(
        default_factory=list,
        description="Tools the policy may call while it answers (TRL's GRPOTrainer tools): "
        "`file.py:function` (relative to the config file) or `module:function`; typed Python "
        "functions, sync or async, with a Google-style docstring describing each argument. "
        "Their results are appended to the completion and masked from the loss. An entry "
        "{function: ..., sandbox: true} runs each call of that tool in the code sandbox.",
    )
    environment_factory: str | None = Field(
        None,
        description="An environment with TRL's contract: `file.py:Class` (relative to the config "
        "file) or `module:factory`. One instance per rollout; reset(**row) returns text to "
        "append to the prompt, or None; its public methods are tools; an optional get_reward() "
        "is read by the `environment` reward type.",
    )
    training: TrainingConfig = Field(
        default_factory=TrainingConfig, description="GRPO hyperparameters (TRL's names)."
    )
    monitors: MonitorConfig = Field(
        default_factory=MonitorConfig, description="Reward-hacking monitors and thresholds."
    )
    _config_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _config_path: Path | None = PrivateAttr(default=None)
    _system_prompt: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _trl_model_settings(cls, data: Any) -> Any:
        """TRL keeps training.bf16 and training.gradient_checkpointing with the training
        arguments; here they are settings of the model. Read once, into model:, so that nothing
        downstream has two places to look (an explicit, different model: value is a conflict)."""
        if not isinstance(data, dict) or not isinstance(data.get("training"), dict):
            return data
        training, model = data["training"], data.get("model") or {}
        if not isinstance(model, dict):
            return data
        moved: dict[str, Any] = {}
        if training.get("bf16") is True:
            moved["dtype"] = "bfloat16"
        checkpointing = training.get("gradient_checkpointing")
        if checkpointing is None:  # transformers 5's name for it
            checkpointing = training.get("activation_checkpointing")
        if isinstance(checkpointing, bool):
            moved["gradient_checkpointing"] = checkpointing
        for key, value in moved.items():
            if key in model and model[key] != value:
                raise ValueError(
                    f"model.{key} is {model[key]!r} but training.{_TRL_NAMES[key]} asks for "
                    f"{value!r}; set one of them"
                )
        return data | {"model": model | moved} if moved else data

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> GRPOKitConfig:
        validate_reward_specs(self.rewards)
        names = [spec.display_name for spec in self.rewards]
        unknown = [n for n in self.monitors.heldout.watch if n not in names]
        if unknown:
            raise ValueError(
                f"monitors.heldout.watch names {', '.join(map(repr, unknown))}, not a reward of "
                f"this config; rewards: {', '.join(names)}"
            )
        best = self.training.best_metric
        if best is not None:
            if not self.data.heldout:
                raise ValueError(
                    f"training.metric_for_best_model ({best}) is measured on the held-out "
                    "prompts: set data.heldout"
                )
            reward = best.removeprefix("eval/").removesuffix("/mean")
            if best.endswith("/mean") and reward not in names:
                raise ValueError(
                    f"training.metric_for_best_model: {best} names {reward!r}, not a reward of "
                    f"this config; rewards: {', '.join(names)}"
                )
        # Relative paths resolve against the config file's directory, which load_config passes
        # in; a config validated without one resolves against the working directory.
        base = (info.context or {}).get("config_dir")
        if base is not None:
            self._config_dir = Path(base)
        self._system_prompt = self.data.system_prompt
        if self.data.system_prompt_file:
            path = self.resolve(self.data.system_prompt_file)
            if not path.is_file():
                raise ValueError(f"data.system_prompt_file: {path} does not exist")
            self._system_prompt = read_utf8(path).strip()
        return self

    @field_validator("tools")
    @classmethod
    def _tool_paths(cls, entries: list[str | ToolSpec]) -> list[str | ToolSpec]:
        for i, entry in enumerate(entries):
            path = entry if isinstance(entry, str) else entry.function
            if not FUNCTION_PATH.match(path.strip()):
                raise ValueError(
                    f"tools[{i}] {path!r} is not of the form `module:function` (e.g. "
                    "my_tools.py:calculator)"
                )
        return [e.strip() if isinstance(e, str) else e for e in entries]

    @property
    def tool_specs(self) -> list[ToolSpec]:
        """Every ``tools:`` entry as a :class:`ToolSpec` (a plain path runs in this process)."""
        return [ToolSpec(function=e) if isinstance(e, str) else e for e in self.tools]

    @field_validator("environment_factory")
    @classmethod
    def _environment_path(cls, entry: str | None) -> str | None:
        if entry is not None and not FUNCTION_PATH.match(entry.strip()):
            raise ValueError(f"{entry!r} is not of the form `module:Class` (e.g. my_env.py:Game)")
        return None if entry is None else entry.strip()

    @model_validator(mode="after")
    def _reward_weights(self) -> GRPOKitConfig:
        # TRL's reward_weights: one weight per reward function, replacing their own weights.
        weights = self.training.reward_weights
        if weights is not None:
            if len(weights) != len(self.rewards):
                names = ", ".join(spec.display_name for spec in self.rewards)
                raise ValueError(
                    f"training.reward_weights has {len(weights)} weight(s) but there are "
                    f"{len(self.rewards)} rewards ({names}); give one weight per reward, in "
                    "the order of `rewards:`, or set each reward's `weight:`"
                )
            for spec, weight in zip(self.rewards, weights, strict=True):
                spec.weight = weight
        return self

    @property
    def config_dir(self) -> Path:
        """Directory that relative paths in the config resolve against."""
        return self._config_dir

    @property
    def config_path(self) -> Path | None:
        return self._config_path

    def resolve(self, path: str | Path) -> Path:
        """A path from the config, relative to the config file's directory."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self._config_dir / p)

    @property
    def output_dir(self) -> Path:
        if self.training.output_dir:
            return self.resolve(self.training.output_dir)
        stem = self._config_path.stem if self._config_path else "run"
        return Path.cwd() / "runs" / stem

    @property
    def system_prompt(self) -> str | None:
        """data.system_prompt, or the text of data.system_prompt_file (read when the config
        was validated, so a missing file is a config error with its line)."""
        return self._system_prompt

    def to_yaml(self) -> str:
        return yaml.safe_dump(
            self.model_dump(mode="json", exclude_none=True), sort_keys=False, allow_unicode=True
        )
