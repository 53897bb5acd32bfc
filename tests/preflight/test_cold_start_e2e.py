"""The cold start and its cure on the embedded model, end to end through the CLI (slow).

Two-digit addition with a strict <thinking>/<answer> format: preflight detects the cold start
(exit 1), `grpokit sft` on generated demonstrations warm-starts the model, preflight then says go,
and a short `grpokit train` from that checkpoint raises the pass rate further.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.config import EMBEDDED_MODEL
from grpokit.data.tasks import ARITHMETIC_SYSTEM_PROMPT, write_arithmetic_task

pytestmark = pytest.mark.slow

SFT_STEPS = int(os.environ.get("GRPOKIT_E2E_SFT_STEPS", "8"))
GRPO_STEPS = int(os.environ.get("GRPOKIT_E2E_GRPO_STEPS", "6"))
PROMPTS = 4  # x 8 generations = 32 samples per preflight


def _config(tmp_path: Path) -> Path:
    paths = write_arithmetic_task(tmp_path / "data", n_train=64, n_heldout=8, n_demos=64)
    doc: dict[str, Any] = {
        "model": {"name_or_path": EMBEDDED_MODEL, "lora": {"r": 16, "alpha": 32}},
        "data": {"train": str(paths["train"]), "system_prompt": ARITHMETIC_SYSTEM_PROMPT},
        "rewards": [
            {"type": "xml_format", "name": "format", "tags": ["thinking", "answer"]},
            {
                "type": "math_answer",
                "name": "answer",
                "answer_column": "answer",
                "gate": {"reward": "format", "min": 1.0},
            },
        ],
        "training": {
            "output_dir": "run",
            "learning_rate": 2e-4,
            "max_steps": GRPO_STEPS,
            "num_generations": 8,
            "per_device_train_batch_size": 8,
            "gradient_accumulation_steps": 2,
            "max_completion_length": 64,
            "beta": 0.04,
            "lr_scheduler_type": "constant",
            "seed": 0,
            "report_to": ["none"],
        },
    }
    path = tmp_path / "arith.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _preflight(cfg: Path, *extra: str) -> tuple[int, str, dict[str, Any]]:
    out = cfg.parent / f"pf-{time.monotonic_ns()}.json"
    result = CliRunner().invoke(
        main, ["preflight", str(cfg), "--prompts", str(PROMPTS), "--out", str(out), *extra]
    )
    print(result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output, json.loads(out.read_text())


def _rate(doc: dict[str, Any], name: str) -> float:
    rate = doc["rewards"][name]["measured_pass_rate"]
    assert rate is not None
    return float(rate)


def test_cold_start_sft_then_train(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    cfg = _config(tmp_path)
    times: dict[str, float] = {}

    code, output, base = _preflight(cfg)
    times["preflight base"] = time.perf_counter() - t0
    assert code == 1, output
    assert base["verdict"]["status"] == "cold_start"
    assert base["rewards"]["format"]["passed"] == 0
    assert "grpokit sft" in output and "COLD START" in output

    sft_dir = tmp_path / "sft"
    demos = tmp_path / "data" / "demos.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "sft",
            str(cfg),
            "--data",
            str(demos),
            "--full",
            "--steps",
            str(SFT_STEPS),
            "--batch-size",
            "8",
            "--learning-rate",
            "2e-5",
            "--output",
            str(sft_dir),
        ],
    )
    print(result.output)
    assert result.exit_code == 0, result.output
    times["sft"] = time.perf_counter() - t0

    code, output, warm = _preflight(cfg, "--checkpoint", str(sft_dir))
    times["preflight after sft"] = time.perf_counter() - t0
    assert code == 0, output
    assert warm["verdict"]["status"] in ("go", "low_signal")
    assert _rate(warm, "format") > 0.0

    result = CliRunner().invoke(
        main,
        ["train", str(cfg), "--no-progress", "--set", f"model.init_from={sft_dir}"],
    )
    print(result.output)
    assert result.exit_code == 0, result.output
    times["train"] = time.perf_counter() - t0
    run_dir = tmp_path / "run"
    ckpt = run_dir / f"checkpoint-{GRPO_STEPS}"
    assert ckpt.is_dir()

    code, output, trained = _preflight(cfg, "--checkpoint", str(ckpt))
    times["preflight after train"] = time.perf_counter() - t0
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = {
        "format": [_rate(d, "format") for d in (base, warm, trained)],
        "answer": [_rate(d, "answer") for d in (base, warm, trained)],
        "train pass_rate/format": [round(m.get("pass_rate/format", -1), 3) for m in metrics],
        "train reward": [round(m.get("reward", -1), 3) for m in metrics],
        "times": {k: round(v) for k, v in times.items()},
    }
    print(json.dumps(summary, indent=1))
    assert code == 0, output
    # Pass rate: preflight after training against preflight after SFT (same prompts, same seed).
    score_warm = _rate(warm, "format") + _rate(warm, "answer")
    score_trained = _rate(trained, "format") + _rate(trained, "answer")
    assert score_trained > score_warm, summary
