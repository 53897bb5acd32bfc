"""Imports flow one way, each package importing only from packages on lower floors:
errors, files, progress <- native.build <- core <- hub <- models, data, rewards, monitor
<- native <- rollout, trl_fields <- config <- sampling, config_docs <- train, evaluate, preflight,
recipes <- the commands (FLOORS below).
The floors are stated here and nowhere else; README.md and docstrings that speak of one point here.
Parsed from the source, imports inside functions included, so a lazy import cannot hide a layer
violation."""

from __future__ import annotations

import ast
from pathlib import Path

import grpokit

SRC = Path(grpokit.__file__).parent

# Each package imports its own modules and packages of lower floors, never one of its own floor
# or above. The command modules (cli.py, *_cli.py, cli_options.py, demo.py, __main__) form the
# top floor whatever package they live in; they may use each other, nothing below may use them.
# A module named here (package.module) sits on its own floor, below its package: native.build,
# the C++ kernels' compiler, serves the loss (core) as well as the decoder above models.
FLOORS: list[tuple[str, ...]] = [
    ("errors", "files", "progress"),
    ("native.build",),
    ("core",),
    ("hub",),
    ("models", "data", "rewards", "monitor"),
    ("native",),
    ("rollout", "trl_fields"),
    ("config",),
    ("sampling", "config_docs"),
    ("train", "evaluate", "preflight", "recipes"),
]
RANKS: dict[str, int] = {package: floor for floor, names in enumerate(FLOORS) for package in names}
COMMANDS = len(FLOORS)


def _unit(module: str) -> str:
    """grpokit.train.trainer -> train; grpokit.errors -> errors; grpokit.native.build ->
    native.build (a module with a floor of its own)."""
    parts = module.split(".")[1:3]
    return ".".join(parts) if ".".join(parts) in RANKS else (parts[0] if parts else "")


def _is_command(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last in ("cli", "cli_options", "__main__", "demo") or last.endswith("_cli")


def _rank(module: str) -> int:
    if _is_command(module):
        return COMMANDS
    unit = _unit(module)
    if unit not in RANKS:
        raise AssertionError(f"{module}: add its package to FLOORS in tests/test_layers.py")
    return RANKS[unit]


def _allowed(module: str, imported: str) -> bool:
    """May ``module`` import ``imported``: its own package (but not a command in it), a lower
    floor, or, for a command, another command."""
    if _is_command(imported):
        return _is_command(module)
    if _unit(module) == _unit(imported):
        return True
    return _rank(imported) < _rank(module)


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


def test_every_package_imports_only_from_lower_floors() -> None:
    wrong = []
    for module, path in _modules().items():
        if module == "grpokit":
            continue
        for imported in _imports(module, path):
            if _allowed(module, imported):
                continue
            wrong.append(
                f"{module} (floor {_rank(module)}) imports {imported} (floor {_rank(imported)})"
            )
    assert not wrong, "imports against the floor order:\n" + "\n".join(sorted(wrong))


def test_packages_do_not_import_each_other_in_a_cycle() -> None:
    """No package reaches itself through others' imports."""
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
    assert not _allowed("grpokit.models.m", "grpokit.train.trainer")
    assert _allowed("grpokit.models.m", "grpokit.models.sibling")


def test_the_order_is_strict() -> None:
    """Down is allowed; sideways (same floor, another package) and up are not; commands sit on
    top of their own package too."""
    assert _allowed("grpokit.train.setup", "grpokit.sampling.sampler")
    assert not _allowed("grpokit.train.setup", "grpokit.evaluate.report")
    assert not _allowed("grpokit.train.sft_run", "grpokit.preflight.inputs")
    assert not _allowed("grpokit.config.loading", "grpokit.sampling")
    assert not _allowed("grpokit.evaluate.generate", "grpokit.evaluate.generate_cli")
    assert not _allowed("grpokit.train.trainer", "grpokit.cli_options")
    assert _allowed("grpokit.train.sft_cli", "grpokit.cli_options")
    assert _allowed("grpokit.cli", "grpokit.evaluate.report")
    # native's build sits below core, its decoder above models
    assert _allowed("grpokit.core.logprobs", "grpokit.native.build")
    assert not _allowed("grpokit.core.logprobs", "grpokit.native.fused")
    assert _allowed("grpokit.native.decoders", "grpokit.models.compat")
    assert not _allowed("grpokit.native.build", "grpokit.native.decoders")
    assert _allowed("grpokit.native.fused", "grpokit.native.build")
