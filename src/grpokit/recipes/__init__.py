"""Ready configs shipped inside the package, one directory per recipe.

A recipe directory holds one or more ``config*.yaml`` files and the data, system prompt and
rubric files they name by paths relative to the config, plus a README.md whose first line says
what the recipe trains. They ship in the wheel, so ``pip install grpokit`` is enough:
``grpokit recipes copy NAME DIR`` writes a recipe out as a whole directory, and its relative
paths resolve there as they do here.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from grpokit.errors import UserError

RECIPES_DIR = Path(__file__).resolve().parent
"""Where the shipped recipes live (inside the installed package)."""

ABOUT_FILE = "README.md"


@dataclass(frozen=True)
class Recipe:
    """A shipped recipe: its name, directory, config files and one-line summary."""

    name: str
    path: Path
    configs: tuple[str, ...]
    summary: str


def _summary(directory: Path) -> str:
    about = directory / ABOUT_FILE
    if not about.is_file():
        return ""
    first = about.read_text(encoding="utf-8").strip().splitlines()[0]
    return first.lstrip("# ").strip()


def available() -> list[Recipe]:
    """Every shipped recipe (a directory holding at least one ``config*.yaml``), by name."""
    out = []
    for directory in sorted(p for p in RECIPES_DIR.iterdir() if p.is_dir()):
        configs = tuple(sorted(p.name for p in directory.glob("config*.yaml")))
        if configs:
            out.append(Recipe(directory.name, directory, configs, _summary(directory)))
    return out


def recipe_dir(name: str) -> Path:
    """The directory of the shipped recipe ``name``; an unknown name is a UserError listing
    the known ones."""
    for recipe in available():
        if recipe.name == name:
            return recipe.path
    known = ", ".join(r.name for r in available())
    raise UserError(f"no recipe named {name!r}; the recipes are: {known} (grpokit recipes list)")


def copy_recipe(name: str, dest: str | Path) -> Path:
    """Write the recipe ``name`` to the directory ``dest`` (created), ready to edit.

    The whole directory is copied, so the relative paths in its configs (data, system prompt,
    rubric files) resolve in the copy. ``dest`` must not exist or be empty: nothing of the
    user's is overwritten.

    Returns:
        ``dest`` as a Path.
    """
    source = recipe_dir(name)
    out = Path(dest)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(
            f"{out} already exists and is not an empty directory; choose a new directory to copy "
            f"the recipe {name!r} into"
        )
    shutil.copytree(
        source, out, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True
    )
    return out
