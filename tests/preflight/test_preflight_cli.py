"""`grpokit preflight` on the tiny random model: cold start (exit 1) and go (exit 0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from grpokit.cli import main

PARITY = '''
def even_length(prompts, completions, **columns):
    """1 for completions with an even number of characters: about half of random texts."""
    return [1.0 if len(c) % 2 == 0 else 0.0 for c in completions]
'''


def _config(tmp_path: Path, model_dir: Path, rewards: list[dict[str, Any]]) -> Path:
    (tmp_path / "parity.py").write_text(PARITY)
    prompts = [{"prompt": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(10, 22)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    doc = {
        "model": {"name_or_path": str(model_dir)},
        "data": {"train": "train.jsonl", "system_prompt": "Answer as <answer>N</answer>."},
        "rewards": rewards,
        "training": {
            "num_generations": 4,
            "per_device_train_batch_size": 8,
            "max_completion_length": 6,
            "beta": 0.04,
            "output_dir": "run",
            "report_to": ["none"],
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_cold_start_exit_1(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        [
            {"type": "xml_format", "name": "format", "tags": ["answer"]},
            {
                "type": "math_answer",
                "name": "answer",
                "answer_column": "answer",
                "gate": {"reward": "format", "min": 1.0},
            },
        ],
    )
    result = CliRunner().invoke(main, ["preflight", str(cfg), "--prompts", "3"])
    assert result.exit_code == 1, result.output
    assert "COLD START" in result.output and "grpokit sft" in result.output
    doc = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert doc["schema"] == "grpokit.preflight/1"
    assert doc["verdict"]["status"] == "cold_start" and doc["verdict"]["exit_code"] == 1
    assert doc["settings"]["samples"] == 12 and doc["settings"]["generations"] == 4
    fmt = doc["rewards"]["format"]
    assert (fmt["passed"], fmt["applicable"]) == (0, 12)
    assert fmt["measured_pass_rate"] == 0.0 and fmt["forecast"] == 0.0
    assert fmt["pass_rate_interval"][1] > 0.2  # 0/12: the interval reaches 24%
    assert doc["rewards"]["answer"]["gated_out_share"] == 1.0
    assert doc["total"]["zero_variance_share"] == 1.0
    # Random tokens never end early at 6 tokens: truncation is reported.
    assert doc["completions"]["truncated_share"] == 1.0
    assert doc["partial_credit"][0]["type"] == "tags_present"


def test_go_exit_0_and_out_file(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        [{"type": "python", "name": "even", "function": "parity.py:even_length", "max_value": 1.0}],
    )
    out = tmp_path / "elsewhere" / "pf.json"
    result = CliRunner().invoke(
        main, ["preflight", str(cfg), "--prompts", "4", "--generations", "6", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "forecast" in result.output and "not a promise" in result.output
    doc = json.loads(out.read_text())
    even = doc["rewards"]["even"]
    assert 0 < even["passed"] < 24 and even["applicable"] == 24
    assert doc["verdict"]["status"] in ("go", "low_signal")
    assert doc["total"]["zero_variance_share"] < 1.0
    # beta 0.04 with std scaling: forecast above the measured rate.
    assert even["forecast"] > even["measured_pass_rate"]


def test_bad_checkpoint_is_a_user_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = _config(tmp_path, tiny_model_dir, [{"type": "xml_format", "tags": ["answer"]}])
    result = CliRunner().invoke(
        main, ["preflight", str(cfg), "--checkpoint", str(tmp_path / "nope")]
    )
    assert result.exit_code == 2
    assert "no such directory" in result.output
