"""The `grpokit` command as a user runs it: help, a real training run, and clean user errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from grpokit.cli import main, register_commands


def grpokit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "grpokit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_help_lists_every_command() -> None:
    out = grpokit("--help")
    assert out.returncode == 0
    for command in ("train", "demo", "rewards"):
        assert command in out.stdout
    assert grpokit("train", "--help").returncode == 0


def test_a_listed_command_that_is_missing_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A renamed command (or a moved command module) stops the CLI with a message naming it,
    instead of vanishing from `grpokit --help`."""
    import grpokit.models.cli

    group = click.Group()
    register_commands(group)
    assert set(group.commands) == set(main.commands) - {"train", "demo"}
    monkeypatch.delattr(grpokit.models.cli, "export_cmd")
    with pytest.raises(ImportError, match="grpokit.models.cli has no click command 'export_cmd'"):
        register_commands(click.Group())
    with pytest.raises(ModuleNotFoundError, match="grpokit.no_such_cli"):
        register_commands(click.Group(), (("grpokit.no_such_cli", "some_cmd"),))


def test_help_imports_no_torch_transformers_or_matplotlib() -> None:
    """The modules that do the commands' work import them, which takes seconds; `grpokit --help`
    and each command's own `--help` print without importing them (a command imports its work
    when it runs)."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from grpokit.cli import main\n"
        "args = sys.argv[1:]\n"
        "result = CliRunner().invoke(main, [*args, '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(sorted({'torch', 'transformers', 'matplotlib'} & set(sys.modules)))\n"
    )
    for command in ([], *([name] for name in main.commands)):
        out = subprocess.run(
            [sys.executable, "-c", code, *command], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, (command, out.stderr)
        assert out.stdout.strip() == "[]", command


def test_the_listing_says_what_each_command_says_of_itself() -> None:
    """grpokit.cli's table gives each command's name and help as the command itself does, at any
    terminal width."""
    group = click.Group()
    register_commands(group)
    for name, command in group.commands.items():
        for limit in (20, 45, 80, 500):
            listed = main.commands[name].get_short_help_str(limit)
            assert listed == command.get_short_help_str(limit), (name, limit)


def test_help_config_groups_the_training_fields() -> None:
    result = CliRunner().invoke(main, ["train", "--help-config"])
    assert result.exit_code == 0, result.output
    for group in ("generation", "loss", "optimisation", "checkpointing", "logging", "distribution"):
        assert f"training: ({group})" in result.output
    assert "--help-config" in CliRunner().invoke(main, ["train", "--help"]).output


def _tiny_config(tmp_path: Path, tiny_model_dir: Path, **training: object) -> Path:
    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(4))
    )
    doc = {
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"train": "train.jsonl"},
        "rewards": [{"type": "regex_match", "pattern": "[0-9]"}],
        "training": {
            "num_generations": 2,
            "per_device_train_batch_size": 4,
            "max_completion_length": 4,
            "max_steps": 1,
            "report_to": ["none"],
            **training,
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_train_runs_and_resumes_from_the_cli(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _tiny_config(tmp_path, tiny_model_dir)
    out = grpokit("train", str(config), "--no-progress", "--output-dir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "checkpoint-1").is_dir()
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    # The success-amplification forecast is recorded at the first step, beside the pass rate.
    assert 0.0 <= first["forecast/regex_match/pass_rate"] <= 1.0
    assert "pass_rate/regex_match" in first
    # Resuming with a longer schedule extends the run; the changes are recorded with their step.
    run = tmp_path / "run"
    out = grpokit(
        "train",
        str(run),
        "--no-progress",
        "--set",
        "training.max_steps=2",
        "--set",
        "training.temperature=0.7",
    )
    assert out.returncode == 0, out.stderr
    assert "resumed from" in out.stdout + out.stderr
    assert (run / "checkpoint-2").is_dir()
    changes = [json.loads(x) for x in (run / "config_changes.jsonl").read_text().splitlines()]
    assert sorted((c["step"], c["key"], c["old"], c["new"]) for c in changes) == [
        (1, "training.max_steps", 1, 2),
        (1, "training.temperature", 1.0, 0.7),
    ]
    saved = yaml.safe_load((run / "config.yaml").read_text())["training"]
    assert (saved["max_steps"], saved["temperature"]) == (2, 0.7)
    # What the checkpoint depends on cannot change; nothing is written.
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    result = CliRunner().invoke(
        main,
        ["train", str(run), "--set", "training.num_generations=4", "--set", "model.lora={r: 8}"],
    )
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "cannot change when resuming: model.lora (None -> {'r': 8" in result.output
    assert "training.num_generations (2 -> 4): the batch shape" in result.output
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_user_errors_exit_2_with_one_message(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _tiny_config(tmp_path, tiny_model_dir)
    cases = {
        "missing config": (["train", str(tmp_path / "nope.yaml")], "does not exist"),
        "bad override": (
            ["train", str(config), "--set", "training.num_generations=3"],
            "not divisible by num_generations",
        ),
        "unknown key": (
            ["train", str(config), "--set", "training.bata=0.1"],
            "did you mean 'beta'",
        ),
        "not a run dir": (["train", str(tmp_path)], "not a grpokit run directory"),
    }
    for name, (args, expected) in cases.items():
        out = grpokit(*args)
        assert out.returncode == 2, (name, out.stderr)
        assert expected in out.stderr, (name, out.stderr)
        assert "Traceback" not in out.stderr, name
    # Bad data: the file and line of the broken row, before any model is loaded.
    (tmp_path / "train.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n')
    out = grpokit("train", str(config))
    assert out.returncode == 2 and "train.jsonl:2: not valid JSON" in out.stderr


def test_train_refuses_a_bad_config_before_importing_torch(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A mistyped key, a bad value or a wrong path is reported in a fraction of a second: train
    validates the config and the run directory before it imports the trainer (torch and
    transformers, seconds)."""
    config = _tiny_config(tmp_path, tiny_model_dir)
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from grpokit.cli import main\n"
        "result = CliRunner().invoke(main, ['train', *sys.argv[1:]])\n"
        "assert result.exit_code == 2, result.output\n"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))\n"
    )
    for args in (
        [str(tmp_path / "nope.yaml")],
        [str(config), "--set", "training.bata=0.1"],
        [str(config), "--set", "training.loss_type=grpoo"],
        [str(tmp_path)],
    ):
        out = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, (args, out.stderr)
        assert out.stdout.strip() == "[]", args


@pytest.mark.slow  # torchrun and two trainers: 11 s on 2 cores
def test_train_nproc_runs_two_data_parallel_processes(tmp_path: Path, tiny_model_dir: Path) -> None:
    # 2 prompts x 2 generations per step: one whole group per process.
    config = _tiny_config(tmp_path, tiny_model_dir, per_device_train_batch_size=2)
    out = grpokit("train", str(config), "--nproc", "2", "--output-dir", str(tmp_path / "dp"))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = (tmp_path / "dp" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1]  # rank 0 alone logs
    assert [p.name for p in (tmp_path / "dp").glob("checkpoint-*")] == ["checkpoint-1"]
