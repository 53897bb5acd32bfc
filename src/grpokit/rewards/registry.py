"""The registry of reward types usable from YAML by name.

A reward type is a pydantic params model (the YAML keys of one ``rewards:`` entry besides
``type``/``name``/``weight``/``gate``) plus a ``build(params, ctx)`` function returning a
:class:`~grpokit.rewards._base.Reward` (a plain function with TRL's calling convention
``fn(prompts, completions, **columns)`` is accepted too and wrapped into one).

Built-in reward modules register themselves when imported. The registry imports them lazily, on
the first lookup, so that ``import grpokit.rewards`` stays cheap (math-verify, subprocess helpers
and judge clients are only loaded when a config names them).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from grpokit.errors import UserError
from grpokit.rewards._base import Reward

RewardFn = Callable[..., list[float | None]]
"""TRL's reward convention: ``fn(prompts, completions, **columns) -> list[float | None]``.
Every :class:`~grpokit.rewards._base.Reward` is one."""


@dataclass(frozen=True)
class BuildContext:
    """What a reward builder may need beyond its own parameters."""

    base_dir: Path
    """Directory of the YAML config: relative paths in params resolve against it."""
    run_dir: Path | None = None
    """The run directory (caches go under it); None outside training, e.g. ``rewards check``."""
    seed: int = 0
    """The run's seed, for rewards that sample."""


Builder = Callable[[Any, BuildContext], Reward | RewardFn]
"""``build(params, ctx)``: a reward type's factory, called once per run."""


@dataclass(frozen=True)
class RewardType:
    """One registered reward type."""

    name: str
    params_model: type[pydantic.BaseModel]
    build: Builder
    max_value: float | None
    """The reward's maximum (the 'pass' value used by preflight and eval); None if unbounded."""
    max_value_param: bool = False
    """Whether the params' own ``max_value`` is the maximum instead (a user's function, whose
    range only the user knows)."""

    def max_value_of(self, params: pydantic.BaseModel) -> float | None:
        """The maximum of one configured reward of this type."""
        if self.max_value_param:
            value: float | None = getattr(params, "max_value", None)
            return value
        return self.max_value


# Modules that register built-in types at import. Order only affects the order of
# ``reward_types()``. ``grpokit.rewards.judge`` is written separately and may be absent.
_BUILTIN_MODULES: tuple[str, ...] = (
    "grpokit.rewards.builtin.format",
    "grpokit.rewards.builtin.match",
    "grpokit.rewards.builtin.math_answer",
    "grpokit.rewards.builtin.code_tests",
    "grpokit.rewards.builtin.length",
    "grpokit.rewards.builtin.logic_tree",
    "grpokit.rewards.builtin.python_fn",
    "grpokit.rewards.builtin.reward_model",
    "grpokit.rewards.builtin.checklist",
)
_OPTIONAL_MODULES: tuple[str, ...] = ("grpokit.rewards.judge",)

_REGISTRY: dict[str, RewardType] = {}
_loaded = False
_load_lock = threading.RLock()


def register_reward(
    type_name: str,
    params_model: type[pydantic.BaseModel],
    build: Builder,
    *,
    max_value: float | None = 1.0,
    max_value_param: bool = False,
) -> None:
    """Register a reward type under ``type_name`` (the YAML ``type:`` value).

    ``max_value_param``: the params carry the maximum (``max_value``), not the type.

    Re-registering the same name with the same builder (a module imported twice) is a no-op;
    registering a different builder under a taken name is a programming error.
    """
    if not type_name or not type_name.replace("_", "").isalnum():
        raise ValueError(f"reward type name must be an identifier, got {type_name!r}")
    existing = _REGISTRY.get(type_name)
    if existing is not None:
        same = (
            existing.build.__qualname__ == build.__qualname__
            and existing.build.__module__ == build.__module__
        )
        if not same:
            raise ValueError(
                f"reward type {type_name!r} is already registered by {existing.build.__module__}"
            )
    _REGISTRY[type_name] = RewardType(type_name, params_model, build, max_value, max_value_param)


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if _loaded:
            return
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)
        for module in _OPTIONAL_MODULES:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                # Only the optional module itself being absent is tolerated; a missing
                # dependency inside it is a real error and must surface.
                if exc.name != module:
                    raise
        _loaded = True


def get_reward_type(type_name: str) -> RewardType:
    """Look up a registered reward type; raises :class:`UserError` listing the known types."""
    _load_builtins()
    try:
        return _REGISTRY[type_name]
    except KeyError:
        known = ", ".join(reward_types())
        raise UserError(
            f"unknown reward type {type_name!r}; known types: {known}. "
            "For your own function use `type: python` with `function: module:name`."
        ) from None


def reward_types() -> list[str]:
    """Names of all registered reward types, built-ins first."""
    _load_builtins()
    return list(_REGISTRY)
