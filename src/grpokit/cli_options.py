"""The options several commands share, each written once.

An option keeps one name, destination, type and default rule in every command that takes it; the
help text stays each command's own, since it says what the option means there (and users'
scripts and docs quote it). Only command modules import this module.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

_F = TypeVar("_F", bound=Callable[..., Any])


def _path() -> click.Path:
    return click.Path(path_type=Path)


def seed_option(help: str, *, default: int | None = 0) -> Callable[[_F], _F]:
    """``--seed``: an integer; ``default=None`` means the config's ``training.seed``."""
    return click.option(
        "--seed", type=int, default=default, show_default=default is not None, help=help
    )


def overrides_option(help: str) -> Callable[[_F], _F]:
    """``--set KEY=VALUE`` (repeatable), passed on as ``overrides``: config values to override."""
    return click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=help)


def config_option(help: str) -> Callable[[_F], _F]:
    """``--config``: an optional grpokit config file."""
    return click.option("--config", type=_path(), default=None, help=help)


def out_option(
    help: str, *, dest: str = "out", default: Path | None = None, required: bool = False
) -> Callable[[_F], _F]:
    """``--out``: where a command writes its result (a file or a directory, as ``help`` says)."""
    return click.option(
        "--out",
        dest,
        type=_path(),
        default=default,
        show_default=default is not None,
        required=required,
        help=help,
    )


def models_option(help: str) -> Callable[[_F], _F]:
    """``--model [LABEL=]MODEL`` (repeatable, at least one), passed on as ``models``."""
    return click.option("--model", "models", multiple=True, required=True, help=help)


def prompt_count_option(default: int, help: str) -> Callable[[_F], _F]:
    """``--prompts N``, passed on as ``n_prompts``: how many training prompts to sample."""
    return click.option(
        "--prompts", "n_prompts", type=int, default=default, show_default=True, help=help
    )


def generations_option(help: str) -> Callable[[_F], _F]:
    """``--generations``: completions per prompt; default the config's num_generations."""
    return click.option("--generations", type=int, default=None, help=help)


def _check_device(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """The device name checked as model.device is, and present on this machine."""
    if value is None:
        return None
    from pydantic import ValidationError

    from grpokit.config import ModelConfig
    from grpokit.errors import UserError

    try:
        ModelConfig.model_validate({"device": value}).check_device(option="--device")
    except ValidationError as e:
        raise click.BadParameter(e.errors()[0]["msg"].removeprefix("Value error, ")) from None
    except UserError as e:
        raise click.BadParameter(str(e)) from None
    return value


def device_option(help: str) -> Callable[[_F], _F]:
    """``--device``: checked when the command starts, as ``model.device`` is."""
    return click.option("--device", default=None, callback=_check_device, help=help)
