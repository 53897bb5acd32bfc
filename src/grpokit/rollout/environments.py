"""Environments with TRL's contract (GRPOTrainer's ``environment_factory``), so a TRL user's
environment class runs unchanged.

``environment_factory`` (a class, or any function without arguments) makes one instance per
rollout; instances are kept and reused from step to step ("construct once, reset often").
Before each rollout, ``reset(**row)`` gets the dataset row (``prompt`` and the other columns) and
returns text to append to the prompt's last message, or None. The instance's public methods
(not ``reset`` or ``get_reward``, not starting with ``_``) are its tools: typed, documented,
called on that rollout's own instance. An optional ``get_reward()`` scores the rollout from the
instance's state (the ``environment`` reward type reads it); every reward function receives the
instances as ``environments=``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from grpokit.errors import UserError
from grpokit.rewards.builtin.python_fn import load_function
from grpokit.rollout.tools import Tool, tool_from_function

_NOT_TOOLS = ("reset", "get_reward")


def with_observation(prompt: Any, observation: Any) -> Any:
    """``prompt`` (a string or chat messages) with ``observation`` appended to its (last
    message's) text; the prompt itself is not changed."""
    if observation is None:
        return prompt
    if isinstance(prompt, str):
        return prompt + str(observation)
    messages = list(prompt)
    last = dict(messages[-1])
    last["content"] = str(last.get("content") or "") + str(observation)
    return [*messages[:-1], last]


class Environments:
    """The instances of one environment class, and its tools.

    Args:
        factory: makes an instance.
        tools: the class's tool methods (bound to the probe instance; :meth:`tools_of` binds
            them to another).
        first: the probe instance, the first of the pool.
    """

    def __init__(self, factory: Callable[[], Any], tools: list[Tool], first: Any) -> None:
        self.factory = factory
        self.tools = tools
        self.pool: list[Any] = [first]

    @property
    def has_reward(self) -> bool:
        return callable(getattr(self.pool[0], "get_reward", None))

    def take(self, count: int) -> list[Any]:
        """``count`` instances, the kept ones first, more made as needed."""
        while len(self.pool) < count:
            self.pool.append(self.factory())
        return self.pool[:count]

    def tools_of(self, instance: Any) -> dict[str, Tool]:
        """The tools called on ``instance``."""
        return {t.name: Tool(t.name, getattr(instance, t.name), t.schema) for t in self.tools}


def load_environments(
    entry: str,
    base_dir: Path,
    *,
    probe_row: Mapping[str, Any] | None = None,
    field: str = "environment_factory",
) -> Environments:
    """The environment ``entry`` (``file.py:Class`` or ``module:factory``) names, checked: it
    makes an instance, the instance has ``reset``, its tool methods have type hints and
    docstrings, and (given ``probe_row``, a training row) ``reset(**probe_row)`` runs.

    Raises:
        UserError: naming ``field`` and what failed.
    """
    where = f"{field} {entry!r}"
    factory = load_function(entry, base_dir, what=f"{field}: environment")
    try:
        instance = factory()
    except Exception as exc:
        raise UserError(
            f"{where}: making an environment failed: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(getattr(instance, "reset", None)):
        raise UserError(f"{where}: an environment needs a reset(**row) method")
    names = [
        name
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    ]
    tools = [tool_from_function(getattr(instance, n), where=f"{where}: method {n}") for n in names]
    if probe_row is not None:
        try:
            instance.reset(**probe_row)
        except Exception as exc:
            raise UserError(
                f"{where}: reset(**row) failed on the first training row with "
                f"{type(exc).__name__}: {exc}"
            ) from None
    return Environments(factory, tools, instance)
