"""``grpokit judge audit-reward-model`` on a tiny random classifier: the printed numbers against
scores, lengths and correlations computed directly from the same model."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from scipy import stats

from grpokit.cli import main

ROWS = [
    ("What is 2+2?", "4"),
    ("What is 2+2?", "It is four, since two plus two make four."),
    ("Name a colour.", "Blue"),
    ("Name a colour.", "Red, like a fire engine or a ripe tomato in the summer sun."),
    ("Say hi.", "hi"),
    ("Say hi.", "Hello there, it is very nice to meet you today!"),
    ("Count to three.", "one two three"),
]


def write_config(tmp_path: Path, rewards: list[dict[str, Any]]) -> Path:
    (tmp_path / "train.jsonl").write_text('{"prompt": "p"}\n', encoding="utf-8")
    config = {
        "model": {"name_or_path": "smollm2-135m-instruct"},
        "data": {"train": "train.jsonl"},
        "rewards": rewards,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def table_rows(output: str, first_cell: str) -> list[list[str]]:
    """The cells of the printed table rows whose first cell is ``first_cell``."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0] == first_cell:
            rows.append(cells)
    return rows


def direct_scores(model_dir: Path, texts: list[str]) -> list[float]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return [
            model(**tokenizer(t, add_special_tokens=False, return_tensors="pt")).logits[0, 0].item()
            for t in texts
        ]


def test_audit_prints_what_a_direct_computation_gives(
    tiny_classifier_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    config = write_config(
        tmp_path,
        [
            {"type": "xml_format", "tags": ["answer"], "weight": 0.0},
            {"type": "reward_model", "name": "pref", "model": str(tiny_classifier_dir),
             "batch_size": 3, "normalize": "batch"},
        ],
    )  # fmt: skip
    completions = tmp_path / "completions.jsonl"
    completions.write_text(
        "".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in ROWS),
        encoding="utf-8",
    )
    output = tmp_path / "report.json"
    result = CliRunner().invoke(
        main,
        ["judge", "audit-reward-model", str(config), "--completions", str(completions),
         "--k", "3", "--planted-prompts", "2", "--output", str(output)],
        terminal_width=200,
    )  # fmt: skip
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(output.read_text(encoding="utf-8"))

    # Real completions: each text scored alone by a separately loaded copy of the model.
    scores = direct_scores(tiny_classifier_dir, [p + c for p, c in ROWS])
    tokenizer = AutoTokenizer.from_pretrained(tiny_classifier_dir)
    lengths = [len(tokenizer(c, add_special_tokens=False)["input_ids"]) for _, c in ROWS]
    pearson = float(np.corrcoef(lengths, scores)[0, 1])
    spearman = float(stats.spearmanr(lengths, scores).statistic)
    mean, spread = statistics.fmean(scores), statistics.pstdev(scores)

    real_rows = [s for s in report["scores"] if s["kind"] == "real"]
    assert [s["tokens"] for s in real_rows] == lengths
    assert [s["score"] for s in real_rows] == pytest.approx(scores, abs=1e-5)
    assert report["items"] == len(ROWS) and report["k"] == 3
    assert report["mean"] == pytest.approx(mean, abs=1e-5)
    assert report["spread"] == pytest.approx(spread, abs=1e-5)
    real_bias = report["length"][0]
    assert real_bias["samples"] == "real" and real_bias["n"] == len(ROWS)
    assert real_bias["pearson"] == pytest.approx(pearson, abs=1e-4)
    assert real_bias["spearman"] == pytest.approx(spearman, abs=1e-9)  # ranks: exact
    # ... and what was printed: the length table row and the summary line.
    [printed] = table_rows(result.output, "real")
    assert printed == [
        "real",
        str(len(ROWS)),
        f"{real_bias['pearson']:.3f}",
        f"{real_bias['spearman']:.3f}",
    ]
    assert abs(float(printed[2]) - pearson) <= 0.0011
    assert abs(float(printed[3]) - spearman) <= 0.0006
    assert f"mean {mean:.3f}" in result.output and f"{spread:.3f}" in result.output

    # Repeats in other orders and batches: a deterministic model, and the report says so.
    assert report["noise"] < 1e-6 and report["max_repeat_difference"] < 1e-5
    assert "the model is deterministic and adds no noise" in result.output

    # Planted answers for the first 2 prompts: the empty answer wears the config's format tags
    # (a format gate would let it through); the truncated one is the first half of the prompt's
    # first real answer.
    prompts = ["What is 2+2?", "Name a colour."]
    empty = direct_scores(tiny_classifier_dir, [p + "<answer>\n\n</answer>" for p in prompts])
    truncated = direct_scores(
        tiny_classifier_dir, [p + c[: len(c) // 2] for p, c in (ROWS[0], ROWS[2])]
    )
    planted = {p["kind"]: p for p in report["planted"]}
    assert set(planted) == {
        "gibberish", "empty", "prompt_copy", "repetitive", "truncated", "off_topic"
    }  # fmt: skip
    for kind, direct in (("empty", empty), ("truncated", truncated)):
        expected = statistics.fmean(direct)
        assert planted[kind]["n"] == 2
        assert planted[kind]["mean"] == pytest.approx(expected, abs=1e-5)
        beats = sum(s < planted[kind]["mean"] for s in scores) / len(scores)
        assert planted[kind]["beats"] == beats
        verdict = "hackable" if expected >= mean else ("leaks" if beats else "ok")
        assert planted[kind]["verdict"] == verdict
        [row] = table_rows(result.output, kind)
        assert row == [kind, "2", f"{expected:.3f}", f"{beats:.0%}", verdict]
    assert report["length"][1]["n"] == len(ROWS) + 2 * 6  # with the planted answers


def test_chat_prompts_in_the_file_use_the_chat_template(
    tiny_classifier_dir: Path, tmp_path: Path
) -> None:
    from grpokit.rewards.builtin.reward_model import RewardModelParams, RewardModelReward
    from grpokit.rewards.judge.cli import run_reward_model_audit

    config = write_config(
        tmp_path, [{"type": "reward_model", "model": str(tiny_classifier_dir), "device": "cpu"}]
    )
    completions = tmp_path / "chat.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": p}],
         "completion": [{"role": "assistant", "content": c}]}
        for p, c in ROWS[:4]
    ]  # fmt: skip
    completions.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = run_reward_model_audit(config, completions, k=1, planted=False)
    reward = RewardModelReward(RewardModelParams(model=str(tiny_classifier_dir), device="cpu"))
    expected = reward([r["prompt"] for r in rows], [r["completion"] for r in rows])
    assert [s["score"] for s in report.scores] == pytest.approx(expected, abs=1e-5)
    assert report.planted == [] and len(report.length) == 1


def test_a_config_without_a_reward_model_exits_2(tmp_path: Path) -> None:
    config = write_config(tmp_path, [{"type": "xml_format", "tags": ["answer"]}])
    completions = tmp_path / "c.jsonl"
    completions.write_text('{"prompt": "p", "completion": "c"}\n', encoding="utf-8")
    result = CliRunner().invoke(
        main, ["judge", "audit-reward-model", str(config), "--completions", str(completions)]
    )
    assert result.exit_code == 2
    assert "no entry of type reward_model" in result.output
