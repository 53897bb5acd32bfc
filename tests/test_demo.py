"""`grpokit demo` (README's first command) end to end, in its short --quick form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_quick_runs_every_stage(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "grpokit", "demo", "--quick", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "held-out pass rates" in out.stdout and "after GRPO" in out.stdout
    summary = json.loads((tmp_path / "demo_summary.json").read_text())
    assert list(summary["stages"]) == ["base model", "after SFT", "after GRPO"]
    base_format = summary["stages"]["base model"][0]
    assert base_format["name"] == "format" and base_format["applicable"] == 16
    lines = (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    assert (tmp_path / "grpo" / "checkpoint-2" / "model").is_dir()
