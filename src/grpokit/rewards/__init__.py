"""Reward functions and their composition.

Every reward follows TRL's convention ``fn(prompts, completions, **columns) -> list[float | None]``
and is usable from YAML by its type name (see :mod:`grpokit.rewards.registry`) or from Python by
the factory of the same name, e.g. ``grpokit.rewards.xml_format(tags=["thinking", "answer"])``.

Here: the contract (:class:`~grpokit.rewards._base.Reward`, which evaluates a
:class:`~grpokit.rewards._base.RewardBatch` into a :class:`~grpokit.rewards._base.RewardResult`),
the text a reward scores (``text``), the registry of types, the YAML entries (``spec``) and their
composition with weights and gates (``compose``). Below: the built-in types (:mod:`.builtin`), the LLM judge
(:mod:`.judge`), the sandbox that runs code for ``code_tests`` (:mod:`.sandbox`) and the checks
a user runs on a reward before training (:mod:`.audit`).

Importing this package is cheap: reward modules (and math-verify, jsonschema, ...) are imported
on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from grpokit.rewards.registry import (
    BuildContext,
    RewardFn,
    RewardType,
    get_reward_type,
    register_reward,
    reward_types,
)

# Public name -> module that defines it, imported on first attribute access.
_LAZY: dict[str, str] = {
    "Reward": "grpokit.rewards._base",
    "RewardBatch": "grpokit.rewards._base",
    "RewardResult": "grpokit.rewards._base",
    "xml_format": "grpokit.rewards.builtin.format",
    "xml_format_score": "grpokit.rewards.builtin.format",
    "tags_present": "grpokit.rewards.builtin.format",
    "regex_match": "grpokit.rewards.builtin.match",
    "json_schema": "grpokit.rewards.builtin.match",
    "math_answer": "grpokit.rewards.builtin.math_answer",
    "code_tests": "grpokit.rewards.builtin.code_tests",
    "length_penalty": "grpokit.rewards.builtin.length",
    "soft_overlong_punishment": "grpokit.rewards.builtin.length",
    "repetition_penalty": "grpokit.rewards.builtin.length",
    "logic_tree_depth": "grpokit.rewards.builtin.logic_tree",
    "logic_tree_quality": "grpokit.rewards.builtin.logic_tree",
    "RewardModelReward": "grpokit.rewards.builtin.reward_model",
    "GateSpec": "grpokit.rewards.spec",
    "RewardSpec": "grpokit.rewards.spec",
    "validate_reward_specs": "grpokit.rewards.spec",
    "RewardScores": "grpokit.rewards.compose",
    "RewardSet": "grpokit.rewards.compose",
    "build_reward_set": "grpokit.rewards.compose",
    "check_completions": "grpokit.rewards.audit.check",
}

__all__ = [
    "BuildContext",
    "RewardFn",
    "RewardType",
    "get_reward_type",
    "register_reward",
    "reward_types",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'grpokit.rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
