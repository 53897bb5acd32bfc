"""The YAML config: pydantic models with help text, loading with line numbers in errors.

Field names under `training:` follow TRL's GRPOConfig where the meaning is the same, so a TRL
user's settings carry over one to one (the business-ideas recipe's config.yaml holds the seed
article's GRPOConfig).

- :mod:`~grpokit.config.sections`: ``model:`` and ``data:``;
- :mod:`~grpokit.config.training`: ``training:`` (TRL's names, grouped);
- :mod:`~grpokit.config.root`: the whole config and its cross-checks;
- :mod:`~grpokit.config.trl_forms`: TRL's and transformers' ways of writing ``training:``
  settings, read as grpokit's;
- :mod:`~grpokit.config.loading`: reading the YAML file, ``--set`` overrides, error messages;
  reading the prompt rows a config names and checking this machine can run it.
"""

from __future__ import annotations

from grpokit.config.loading import (
    check_machine,
    format_validation_error,
    load_config,
    load_prompt_rows,
    load_reward_specs,
    read_config_data,
    validate_config,
)
from grpokit.config.root import GRPOKitConfig
from grpokit.config.sections import (
    EMBEDDED_MODEL,
    DataConfig,
    DatasetSpec,
    LoraConfig,
    ModelConfig,
    ToolSpec,
)
from grpokit.config.training import (
    GENERATION_KWARGS,
    TRAINING_GROUPS,
    CurriculumConfig,
    FSDPConfig,
    TrainingConfig,
)

__all__ = [
    "EMBEDDED_MODEL",
    "GENERATION_KWARGS",
    "TRAINING_GROUPS",
    "DataConfig",
    "DatasetSpec",
    "CurriculumConfig",
    "FSDPConfig",
    "GRPOKitConfig",
    "LoraConfig",
    "ModelConfig",
    "ToolSpec",
    "TrainingConfig",
    "check_machine",
    "format_validation_error",
    "load_config",
    "load_prompt_rows",
    "load_reward_specs",
    "read_config_data",
    "validate_config",
]
