"""A synthetic run directory as the trainer writes it (helpers for the report tests)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

REWARDS = ("logic_tree_depth", "repetition_penalty")
PROMPT_JA = "体重を減らすにはどうすれば良いですか"
SCRIPT = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>'
ALERTS = {
    18: {"rule": "length_reward", "step": 18, "value": 0.45, "message": "length grew 45%"},
    24: {"rule": "repetition", "step": 24, "value": 0.41, "message": "repeated n-gram share rose"},
}


def _tree(depth: int) -> str:
    lines = ["体重減少"]
    for d in range(depth):
        lines.append("│   " * d + "├── カロリーの少ない食材の選択")
    return "\n".join(lines)


def make_run(run_dir: Path, *, steps: int = 30, beta: float = 0.01, seed: int = 0) -> Path:
    """A run directory as the trainer writes it, with realistic values for a hacked reward."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        "model: {name_or_path: smollm2-135m-instruct}\n"
        "data: {train: train_ja.jsonl}\n"
        "rewards:\n  - {type: logic_tree_depth}\n  - {type: repetition_penalty, weight: 0.5}\n"
        f"training: {{beta: {beta}, num_generations: 4, max_steps: {steps}}}\n",
        encoding="utf-8",
    )
    (run_dir / "versions.json").write_text(
        json.dumps(
            {
                "grpokit": "0.1.0",
                "torch": "2.13.0",
                "transformers": "4.57.0",
                "peft": "0.17.0",
                "python": "3.11.2",
            }
        )  # fmt: skip
    )
    rows = []
    for t in range(1, steps + 1):
        frac = t / steps
        depth = 2 + 4 * frac + rng.gauss(0, 0.2)
        rep = -0.05 - 0.3 * max(0.0, frac - 0.5) + rng.gauss(0, 0.02)
        row: dict[str, object] = {
            "step": t,
            "epoch": round(t / 12, 3),
            "reward": depth + 0.5 * rep,
            "reward_std": 0.8 + rng.gauss(0, 0.05),
            f"rewards/{REWARDS[0]}/mean": depth,
            f"rewards/{REWARDS[0]}/std": 0.9,
            f"rewards/{REWARDS[1]}/mean": rep,
            f"rewards/{REWARDS[1]}/std": 0.1,
            "frac_reward_zero_std": max(0.0, 0.5 - frac * 0.4 + rng.gauss(0, 0.05)),
            "kl": 0.002 * t + abs(rng.gauss(0, 0.002)),
            "entropy": 1.1 - 0.5 * frac + rng.gauss(0, 0.03),
            "clip_ratio/low_mean": 0.0,
            "clip_ratio/high_mean": abs(rng.gauss(0.01, 0.005)),
            "clip_ratio/region_mean": abs(rng.gauss(0.01, 0.005)),
            "mismatch/kl": 0.0125 + abs(rng.gauss(0, 0.001)),
            "mismatch/max_ratio": 1.5,
            "completions/mean_length": 60 + 60 * frac + rng.gauss(0, 3),
            "completions/min_length": 30 + 20 * frac,
            "completions/max_length": min(128, 90 + 40 * frac),
            "completions/clipped_ratio": min(1.0, 0.1 + 0.6 * frac),
            "completions/mean_terminated_length": 55 + 30 * frac,
            "completions/repeated_ngram_frac": 0.05 + 0.5 * max(0.0, frac - 0.5),
            "completions/distinct_2": 0.7 - 0.4 * max(0.0, frac - 0.5),
            "completions/max_group_duplicate_frac": 0.25,
            "num_tokens": 1000 * t,
            "step_time": 11.0 + rng.gauss(0, 0.5),
            "learning_rate": 1e-5,
            "grad_norm": 0.5 + rng.random(),
            "loss": rng.gauss(0, 0.01),
            "time/generate": 8.0 + rng.gauss(0, 0.3),
            "time/score": 0.4,
            "time/update": 2.5,
            f"pass_rate/{REWARDS[0]}": min(1.0, 0.1 + 0.7 * frac),
            f"forecast/{REWARDS[0]}/pass_rate": 0.62,
        }
        if t % 10 == 0:
            row[f"eval/{REWARDS[0]}/mean"] = 2.5 + 0.1 * t
            row[f"eval/{REWARDS[0]}/pass_rate"] = 0.2 + 0.01 * t
            row[f"eval/{REWARDS[1]}/mean"] = -0.05 - 0.01 * t
        if t == 7:
            row["kl"] = math.nan  # the trainer writes null; old files may hold NaN
        if t in ALERTS:
            row["alerts"] = [ALERTS[t]]
        rows.append(row)
    with (run_dir / "metrics.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (run_dir / "completions.jsonl").open("w", encoding="utf-8") as f:
        for t in range(1, steps + 1, 5):
            for i in range(4):
                depth = 2 + t // 5 + i
                text = _tree(depth) if not (t == 1 and i == 3) else SCRIPT
                record = {
                    "step": t,
                    "prompt": [
                        {"role": "system", "content": "ロジックツリー"},
                        {"role": "user", "content": PROMPT_JA},
                    ],  # fmt: skip
                    "completion": text,
                    "reward": float(depth),
                    "rewards": {REWARDS[0]: float(depth), REWARDS[1]: None if i == 0 else -0.1},
                    "advantage": (i - 1.5) / 1.1,
                }
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    (run_dir / "preflight.json").write_text(
        json.dumps({"rewards": {REWARDS[0]: {"measured_pass_rate": 0.1, "forecast": 0.62}}})
    )
    return run_dir
