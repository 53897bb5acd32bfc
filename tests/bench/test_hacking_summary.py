"""bench/hacking_summary.py: the onset of a quality drop and the delay of the first alert after it.

The script reads a run's metrics.jsonl; the rows here are written as the trainer writes them, with
a quality that falls for good from step 6 and an alert at step 8.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _run_dir(path: Path, quality: list[float], alert_steps: set[int]) -> Path:
    path.mkdir()
    rows = []
    for step, q in enumerate(quality, start=1):
        row: dict[str, object] = {
            "step": step,
            "reward": float(step),
            "rewards/logic_tree_quality/mean": q,
            "completions/repeated_ngram_frac": 1.0 - q,
        }
        if step % 5 == 0:
            row["eval/logic_tree_quality/mean"] = q
            row["eval/logic_tree_quality/stderr"] = 0.05
        if step in alert_steps:
            row["alerts"] = [{"rule": "heldout_divergence", "message": "held-out quality fell"}]
        rows.append(json.dumps(row))
    (path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return path


def test_summary_finds_the_onset_and_the_first_alert_after_it(tmp_path: Path) -> None:
    # A dip at step 3 that recovers is not the onset; the fall from step 6 on is.
    hacked = _run_dir(tmp_path / "hacked", [0.5, 0.5, 0.3, 0.5, 0.5] + [0.1] * 7, {2, 8})
    steady = _run_dir(tmp_path / "steady", [0.5, 0.45] * 6, set())
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "hacking_summary.py"),
            str(hacked),
            str(steady),
            "--first",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    first, second = json.loads(out.read_text())
    assert first["onset"] == 6
    assert first["first_alert_after_onset"] == 8
    assert [a["step"] for a in first["alerts"]] == [2, 8]
    assert first["heldout_quality"][-1] == [10, 0.1, 0.05]
    assert second["onset"] is None and second["alerts"] == []
    assert "onset of the quality drop: step 6; first alert from then on: 8 (2 steps" in proc.stdout
    assert "no onset" in proc.stdout
