"""The `grpokit recipes` command: list the shipped recipes, copy one out to edit."""

from __future__ import annotations

from pathlib import Path

import click


def _print_recipes() -> None:
    from grpokit.recipes import available

    for recipe in available():
        click.echo(f"{recipe.name:<16} {recipe.summary}")
        click.echo(f"{'':<16} configs: {', '.join(recipe.configs)}")
    click.echo("\ncopy one out to edit and train it: grpokit recipes copy NAME DIR")


@click.group("recipes", invoke_without_command=True)
@click.pass_context
def recipes_cli(ctx: click.Context) -> None:
    """Ready configs shipped with grpokit: list them, or copy one into a directory to edit.

    \b
      grpokit recipes                       # the list
      grpokit recipes copy arithmetic my-run
      grpokit train my-run/config.yaml
    """
    if ctx.invoked_subcommand is None:
        _print_recipes()


@recipes_cli.command("list")
def list_cmd() -> None:
    """Name, summary and config files of each recipe."""
    _print_recipes()


@recipes_cli.command("copy")
@click.argument("name")
@click.argument("directory", type=click.Path(path_type=Path))
def copy_cmd(name: str, directory: Path) -> None:
    """Write the recipe NAME into DIRECTORY (new or empty): its configs and the files they name.

    Paths inside the configs are relative to the config file, so they resolve in the copy.
    """
    from grpokit.recipes import copy_recipe

    out = copy_recipe(name, directory)
    click.echo(f"wrote the recipe {name!r} to {out}; train it with:")
    for config in sorted(out.glob("config*.yaml")):
        click.echo(f"  grpokit train {config}")
