"""``type: python``: a reward function of the user's own, given by import path.

``function: my_rewards:brevity`` imports ``brevity`` from the module ``my_rewards``: first from
``my_rewards.py`` next to the config file (or a path such as ``rewards/mine.py:brevity``,
relative to the config), otherwise as an importable module. The function must follow TRL's
convention ``fn(prompts, completions, **columns) -> list[float | None]``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grpokit.errors import UserError
from grpokit.rewards._base import FunctionReward, Reward
from grpokit.rewards.registry import BuildContext, register_reward

FUNCTION_PATH = re.compile(r"^(?P<module>[^:]+):(?P<attr>[A-Za-z_][A-Za-z0-9_.]*)$")


class PythonRewardParams(BaseModel):
    """Parameters of ``type: python``."""

    model_config = ConfigDict(extra="forbid")

    function: str = Field(
        description="`module:function`: a module importable from the config's directory or the "
        "Python path, or a .py file path relative to the config, then ':' and the function name."
    )
    columns: list[str] = Field(
        default_factory=list,
        description="Dataset columns the function reads; checked before training starts.",
    )
    max_value: float | None = Field(
        default=None,
        description="The function's best value (pass rate = share of completions at it); "
        "null if unbounded or unknown.",
    )

    @field_validator("function")
    @classmethod
    def _valid_path(cls, function: str) -> str:
        if not FUNCTION_PATH.match(function.strip()):
            raise ValueError(
                f"{function!r} is not of the form `module:function` (e.g. my_rewards:brevity "
                "or rewards/mine.py:brevity)"
            )
        return function.strip()


def load_function(
    function: str, base_dir: Path, *, what: str = "reward function"
) -> Callable[..., Any]:
    """Import ``module:attr`` (a .py path relative to ``base_dir``, or a module name).

    ``what`` names the thing in error messages ("reward function", "tool").

    Raises:
        UserError: the file or module does not exist, fails to import, or lacks the function.
    """
    match = FUNCTION_PATH.match(function)
    if match is None:
        raise UserError(f"{what} {function!r} is not of the form `module:function`")
    module_ref, attr = match.group("module"), match.group("attr")
    candidates = [base_dir / module_ref] if module_ref.endswith(".py") else []
    candidates.append(base_dir / (module_ref.replace(".", "/") + ".py"))
    path = next((p for p in candidates if p.is_file()), None)
    try:
        if path is not None:
            module = _import_file(path.resolve())
        elif module_ref.endswith(".py"):
            raise UserError(f"{what} {function!r}: file {candidates[0]} does not exist")
        else:
            module = importlib.import_module(module_ref)
    except UserError:
        raise
    except ModuleNotFoundError as exc:
        if path is not None:  # the file exists; something it imports does not
            raise UserError(
                f"{what} {function!r}: importing {path} failed with ModuleNotFoundError: {exc}"
            ) from exc
        raise UserError(
            f"{what} {function!r}: no module {module_ref!r} (looked for "
            f"{candidates[-1]} and on the Python path): {exc}"
        ) from exc
    except Exception as exc:
        raise UserError(
            f"{what} {function!r}: importing {module_ref!r} failed with {type(exc).__name__}: {exc}"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UserError(f"{what} {function!r}: {module_ref!r} has no {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UserError(f"{what} {function!r} is not callable")
    return target  # type: ignore[no-any-return]


def _import_file(path: Path) -> Any:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    name = f"grpokit_user_rewards_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _build(params: PythonRewardParams, ctx: BuildContext) -> Reward:
    fn = load_function(params.function, ctx.base_dir)
    return FunctionReward(fn, name=getattr(fn, "__name__", "python"), columns=params.columns)


register_reward("python", PythonRewardParams, _build, max_value=None, max_value_param=True)


class EnvironmentRewardParams(BaseModel):
    """Parameters of ``type: environment``."""

    model_config = ConfigDict(extra="forbid")

    max_value: float | None = Field(
        default=None,
        description="The best value get_reward() returns (pass rate = share of rollouts at it); "
        "null if unbounded or unknown.",
    )


def environment_reward(
    prompts: list[Any], completions: list[Any], environments: list[Any] | None = None, **_: Any
) -> list[float | None]:
    """Each rollout's environment's ``get_reward()`` (awaited when it is a coroutine)."""
    import asyncio
    import inspect

    if environments is None:
        raise UserError("reward type 'environment' needs an environment_factory in the config")
    out: list[float | None] = []
    for env in environments:
        value = env.get_reward()
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
        out.append(None if value is None else float(value))
    return out


async def _awaited(value: Any) -> Any:
    return await value


def _build_environment(params: EnvironmentRewardParams, ctx: BuildContext) -> Reward:
    return FunctionReward(environment_reward, name="environment")


register_reward(
    "environment",
    EnvironmentRewardParams,
    _build_environment,
    max_value=None,
    max_value_param=True,
)
