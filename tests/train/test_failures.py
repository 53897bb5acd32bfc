"""A run never loses its work: a reward that raises, SIGTERM, a full disk and NaN steps all end
in one message and a checkpoint, and the printed command resumes to the same final weights as
an uninterrupted run (full fine-tuning and LoRA)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner
from safetensors.torch import load_file

from grpokit.cli import main

REWARDS = """
import os, pathlib, time

def letter_e(prompts, completions, **columns):
    counter = pathlib.Path(os.environ["GRPOKIT_TEST_COUNTER"])
    calls = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(calls))
    if os.environ.get("GRPOKIT_TEST_FAIL_AT") == str(calls):
        raise KeyError("no such column")
    time.sleep(float(os.environ.get("GRPOKIT_TEST_SLEEP", "0")))
    return [c.count("e") / max(1, len(c)) for c in completions]

def huge(prompts, completions, **columns):
    return [1e37 * (1 + c.count("e")) for c in completions]
"""

LORA = {"lora": {"r": 4, "alpha": 8}}
STEPS = 5


def _config(
    tmp_path: Path, model_dir: Path, run: Path, model: dict[str, Any], **training: Any
) -> Path:
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(REWARDS))
    prompts = [f"Say something about {w}." for w in ["apples", "rivers", "stars", "trees", "music"]]
    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)
    )
    doc = {
        "model": {"name_or_path": str(model_dir), **model},
        "data": {"train": "train.jsonl"},
        "rewards": [{"type": "python", "name": "e", "function": "my_rewards.py:letter_e"}],
        "training": {
            "learning_rate": 1e-3,
            "num_generations": 4,
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "max_completion_length": 8,
            "max_steps": STEPS,
            "seed": 0,
            "report_to": ["none"],
            "output_dir": str(run),
            **training,
        },
    }
    path = tmp_path / f"{run.name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / f"checkpoint-{STEPS}" / "trainable.safetensors"))


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    different = [n for n in a if not torch.equal(a[n], b[n])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def _resume_args(output: str, prefix: str) -> list[str]:
    line = next(x for x in output.splitlines() if x.startswith(prefix))
    args = shlex.split(line.removeprefix(prefix))
    assert args[:2] == ["grpokit", "train"], line
    return args[1:]


@pytest.fixture
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calls.txt"
    monkeypatch.setenv("GRPOKIT_TEST_COUNTER", str(path))
    return path


@pytest.mark.parametrize("model", [{}, LORA], ids=["full", "lora"])
def test_a_reward_that_raises_saves_the_last_step_and_resumes_to_the_same_weights(
    tmp_path: Path,
    tiny_model_dir: Path,
    counter: Path,
    monkeypatch: pytest.MonkeyPatch,
    model: dict[str, Any],
) -> None:
    runner = CliRunner()
    whole = runner.invoke(main, ["train", str(_config(tmp_path, tiny_model_dir, tmp_path / "whole", model)), "--no-progress"])  # fmt: skip
    assert whole.exit_code == 0, whole.output
    counter.unlink()

    monkeypatch.setenv("GRPOKIT_TEST_FAIL_AT", "3")
    run = tmp_path / "failed"
    failed = runner.invoke(main, ["train", str(_config(tmp_path, tiny_model_dir, run, model)), "--no-progress"])  # fmt: skip
    assert failed.exit_code == 1, failed.output
    assert "Traceback" not in failed.output
    assert "step 3 failed: reward 'e' raised KeyError" in failed.output
    saved = run / "failed-step-3.jsonl"
    assert f"are in {saved}" in failed.output and "grpokit rewards check" in failed.output
    rows = [json.loads(line) for line in saved.read_text().splitlines()]
    assert len(rows) == 8 and all("completion" in r and "prompt" in r for r in rows)
    assert f"checkpoint of step 2 saved: {run / 'checkpoint-2'}" in failed.output
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"]

    monkeypatch.delenv("GRPOKIT_TEST_FAIL_AT")
    # The printed replay command finds the reward's file (next to the original config).
    replay = next(x for x in failed.output.splitlines() if "replay them with: " in x)
    replay_args = shlex.split(replay.split("replay them with: ", 1)[1])
    assert replay_args[:3] == ["grpokit", "rewards", "check"], replay
    replayed = runner.invoke(main, replay_args[1:])
    assert replayed.exit_code == 0, replayed.output
    assert "failed-step-3.jsonl" in replay and "Traceback" not in replayed.output
    counter.write_text("2")  # the reward's own count, as an uninterrupted run would have it
    resumed = runner.invoke(main, _resume_args(failed.output, "resume with: "))
    assert resumed.exit_code == 0, resumed.output
    _assert_same(_final_weights(run), _final_weights(tmp_path / "whole"))


def test_debug_shows_the_traceback_behind_the_message(
    tmp_path: Path, tiny_model_dir: Path, counter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRPOKIT_TEST_FAIL_AT", "1")
    monkeypatch.setenv("GRPOKIT_DEBUG", "0")  # restored afterwards: --debug sets it for the process
    config = _config(tmp_path, tiny_model_dir, tmp_path / "run", {})
    result = CliRunner().invoke(main, ["train", str(config), "--no-progress", "--debug"])
    assert result.exit_code == 1
    assert "Traceback" in result.output and "KeyError" in result.output
    assert "there is no checkpoint yet" not in result.output  # step 0 is saved instead
    assert "checkpoint of step 0 saved" in result.output


def test_non_finite_steps_are_skipped_then_stop_the_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = _config(tmp_path, tiny_model_dir, tmp_path / "run", {}, scale_rewards="none")
    doc = yaml.safe_load(config.read_text())
    doc["rewards"][0]["function"] = "my_rewards.py:huge"  # gradients overflow float32
    config.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["train", str(config), "--no-progress"])
    assert result.exit_code == 1, result.output
    assert "3 optimizer steps in a row had a NaN or infinite" in result.output
    assert "rewards on a very large scale" in result.output
    assert "checkpoint of step 3 saved" in result.output
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_steps"] for r in records] == [1, 2, 3]
    assert not any(torch.isnan(w).any() for w in load_file(str(tmp_path / "run" / "checkpoint-3" / "trainable.safetensors")).values())  # fmt: skip


def _grpokit(args: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "grpokit", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _env(counter: Path) -> dict[str, str]:
    # One thread, as in the test process: the same arithmetic on both sides of a comparison.
    return {**os.environ, "OMP_NUM_THREADS": "1", "GRPOKIT_TEST_COUNTER": str(counter)}


@pytest.mark.slow
def test_sigterm_saves_and_the_printed_command_resumes(
    tmp_path: Path, tiny_model_dir: Path, counter: Path
) -> None:
    env = _env(counter)
    whole = _grpokit(["train", str(_config(tmp_path, tiny_model_dir, tmp_path / "whole", {})), "--no-progress"], env)  # fmt: skip
    assert whole.wait(timeout=600) == 0, whole.communicate()[1]
    counter.unlink()

    run = tmp_path / "stopped"
    config = _config(tmp_path, tiny_model_dir, run, {})
    proc = _grpokit(["train", str(config), "--no-progress"], env | {"GRPOKIT_TEST_SLEEP": "1"})
    deadline = time.monotonic() + 600
    while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr
    stopped_at = len((run / "metrics.jsonl").read_text().splitlines())
    assert stopped_at < STEPS and (run / f"checkpoint-{stopped_at}").is_dir()
    counter.write_text(str(stopped_at))

    again = _grpokit(_resume_args(stderr, "continue with: "), env)
    assert again.wait(timeout=600) == 0, again.communicate()[1]
    _assert_same(_final_weights(run), _final_weights(tmp_path / "whole"))


def _can_mount_tmpfs(where: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1M tmpfs {where}"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.slow
def test_a_full_disk_keeps_the_earlier_checkpoints_and_resumes(
    tmp_path: Path, tiny_model_dir: Path, counter: Path
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _can_mount_tmpfs(disk):
        pytest.skip("needs `unshare -m` and tmpfs mounts (root or user namespaces)")
    env = _env(counter)
    whole = _grpokit(["train", str(_config(tmp_path, tiny_model_dir, tmp_path / "whole", {}, save_steps=2)), "--no-progress"], env)  # fmt: skip
    assert whole.wait(timeout=600) == 0, whole.communicate()[1]
    counter.unlink()
    size = sum(p.stat().st_size for p in (tmp_path / "whole" / "checkpoint-2").rglob("*"))
    run = disk / "run"
    config = _config(tmp_path, tiny_model_dir, run, {}, save_steps=2)
    python = shlex.quote(sys.executable)
    # Room for one checkpoint and the logs, not two: the write of checkpoint-4 runs out of space.
    script = f"""
        mount -t tmpfs -o size={int(size * 1.6)} tmpfs {disk}
        {python} -m grpokit train {config} --no-progress; echo "exit=$?"
        ls -a {run}
        rm -f {run}/metrics.jsonl.* ; mount -o remount,size={size * 6} {disk}
        echo 4 > {counter}
        {python} -m grpokit train {run} --no-progress; echo "exit=$?"
        cp -r {run}/checkpoint-{STEPS} {tmp_path}/resumed
    """
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=1200)  # fmt: skip
    log = out.stdout + out.stderr
    first, second = (line for line in out.stdout.splitlines() if line.startswith("exit="))
    assert first == "exit=1", log
    assert f"the disk holding {run} is full" in log and "Traceback" not in log, log
    assert "free; a checkpoint takes about" in log and "(checkpoint-2)" in log, log
    assert f"the latest checkpoint is {run / 'checkpoint-2'}" in log
    listing = out.stdout.split("exit=1", 1)[1].split("exit=", 1)[0]
    assert "checkpoint-2" in listing and ".tmp-checkpoint" not in listing, listing
    assert second == "exit=0", log
    resumed = load_file(str(tmp_path / "resumed" / "trainable.safetensors"))
    _assert_same(resumed, _final_weights(tmp_path / "whole"))


def test_a_second_writer_is_refused_while_readers_are_not_and_a_crash_frees_the_run(
    tmp_path: Path, tiny_model_dir: Path, counter: Path
) -> None:
    import socket

    run = tmp_path / "run"
    config = _config(tmp_path, tiny_model_dir, run, {}, max_steps=1000)  # killed long before
    first = _grpokit(["train", str(config), "--no-progress"], _env(counter) | {"GRPOKIT_TEST_SLEEP": "1"})  # fmt: skip
    deadline = time.monotonic() + 600
    while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.2)
    try:
        for args in (["train", str(config)], ["train", str(run)]):  # a fresh start, a resume
            second = _grpokit([*args, "--no-progress"], _env(counter))
            _, stderr = second.communicate(timeout=600)
            assert second.returncode == 2, stderr
            assert "Traceback" not in stderr
            assert f"{run} is in use by another grpokit process (PID {first.pid} on host {socket.gethostname()}" in stderr  # fmt: skip
        # Readers take no lock.
        report = CliRunner().invoke(main, ["report", str(run)])
        assert report.exit_code == 0, report.output
        assert first.poll() is None  # the first run was never disturbed
    finally:
        first.kill()  # SIGKILL: no clean-up runs, the kernel releases the lock
        first.communicate(timeout=600)
    after = CliRunner().invoke(main, ["train", str(run), "--no-progress"])
    assert "in use by another" not in after.output, after.output


def test_the_disk_full_advice_names_the_directory_its_free_space_and_a_checkpoints_size(
    tmp_path: Path,
) -> None:
    from grpokit.train.failures import disk_full_advice

    ckpt = tmp_path / "checkpoint-4"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "optimizer.pt").write_bytes(b"\0" * (3 << 20))
    (ckpt / "model" / "adapter_model.safetensors").write_bytes(b"\0" * (1 << 19))
    advice = disk_full_advice(tmp_path, ckpt)
    free_gb = shutil.disk_usage(tmp_path).free / (1 << 30)
    assert advice.startswith(f"the disk holding {tmp_path} is full (")
    assert "a checkpoint takes about 3.5 MB (checkpoint-4)" in advice
    assert (f"{free_gb:.1f} GB free" in advice) or (" MB free" in advice), advice
    assert "no earlier checkpoint" in disk_full_advice(tmp_path, None)


def test_sft_into_an_output_another_process_writes_is_refused(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    out = tmp_path / "sft"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from grpokit.train.run_lock import output_lock\nwith output_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)",
            str(out),
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        config = _config(tmp_path, tiny_model_dir, tmp_path / "run", {})
        demos = tmp_path / "demos.jsonl"
        demos.write_text(json.dumps({"prompt": "Say hi.", "completion": "hi"}) + "\n")
        args = ["sft", str(config), "--data", str(demos), "--output", str(out), "--steps", "1"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert f"{out} is in use by another grpokit process (PID {holder.pid}" in result.output
    finally:
        holder.kill()
        holder.communicate(timeout=60)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0, again.output
