"""Imports flow one way (design.md): core <- models, data, rewards, monitor <- rollout <- config
<- sampling <- train, evaluate, preflight <- the commands. Parsed from the source, imports inside
functions included, so a lazy import cannot hide a layer violation."""

from __future__ import annotations

import ast
from pathlib import Path

import grpokit

SRC = Path(grpokit.__file__).parent

# Higher may import lower or equal, never higher. A command module (cli.py, *_cli.py, demo.py,
# __main__) sits on top whatever package it lives in.
RANKS: dict[str, int] = {
    "errors": 0,
    "files": 0,
    "progress": 0,
    "core": 0,
    "model_files": 0,
    "models": 1,
    "data": 1,
    "rewards": 1,
    "monitor": 1,
    "rollout": 2,
    "trl_fields": 3,
    "config": 3,
    "config_docs": 3,
    "sampling": 4,
    "train": 5,
    "evaluate": 5,
    "preflight": 5,
    "recipes": 5,
}
COMMANDS = 6


def _unit(module: str) -> str:
    """grpokit.train.trainer -> train; grpokit.errors -> errors."""
    return module.split(".")[1] if module.count(".") else ""


def _rank(module: str) -> int:
    last = module.rsplit(".", 1)[-1]
    if last in ("cli", "__main__", "demo") or last.endswith("_cli"):
        return COMMANDS
    unit = _unit(module)
    if unit not in RANKS:
        raise AssertionError(f"{module}: add its package to RANKS in tests/test_layers.py")
    return RANKS[unit]


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(("grpokit", *parts))] = path
    return out


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("grpokit."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            if name.startswith("grpokit."):
                found.add(name)
    return found


def test_no_module_imports_a_higher_layer() -> None:
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        if module == "grpokit":
            continue
        for imported in _imports(module, path):
            if _rank(imported) > _rank(module):
                wrong.append(f"{module} (layer {_rank(module)}) imports {imported}")
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


def test_packages_do_not_import_each_other_in_a_cycle() -> None:
    """Within a layer packages may use each other, but never both ways (a cycle)."""
    graph: dict[str, set[str]] = {}
    for module, path in _modules().items():
        if module == "grpokit" or _rank(module) == COMMANDS:
            continue
        for imported in _imports(module, path):
            a, b = _unit(module), _unit(imported)
            if a != b and _rank(imported) != COMMANDS:
                graph.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(a for a in graph if reaches(a, a, {a}))
    assert not cycles, f"packages in an import cycle: {cycles} ({graph})"


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from grpokit.core import stats\n"
        "def f():\n    from grpokit.train.trainer import GRPOTrainer\n"
        "from .sibling import x\n"
    )
    found = _imports("grpokit.models.m", source)
    assert found == {"grpokit.core", "grpokit.train.trainer", "grpokit.models.sibling"}
    assert _rank("grpokit.train.trainer") > _rank("grpokit.models.m")
