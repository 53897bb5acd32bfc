"""``grpokit judge pairwise`` on the real llama.cpp server (the embedded SmolLM2 as the judge):
both orders of every pair asked, each reply read back into the verdicts, the files written; and
the clear errors for a wrong eval directory or model label."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from grpokit.rewards.judge.cli import judge_cli

from .conftest import LLAMA_MODEL_ALIAS, LlamaServer

RUBRIC = (
    "Request: {prompt}\n\nAnswer A:\n{a}\n\nAnswer B:\n{b}\n\n"
    "Which answer is more helpful? Reply with the letter A or B only.\nAnswer:"
)
ANSWERS = {
    "base": ["Something.", "I do not know."],
    "trained": [
        "Meal kits for night-shift nurses at 8 USD a box.",
        "A tutoring app, 5 USD a month.",
    ],
}


def _eval_dir(tmp_path: Path) -> Path:
    rows = [
        {"model": model, "prompt_index": p, "sample": k, "prompt": f"Topic {p}",
         "completion": texts[(p + k) % 2], "length": 4 + 3 * (model == "trained")}
        for model, texts in ANSWERS.items() for p in range(2) for k in range(2)
    ]  # fmt: skip
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _config(tmp_path: Path, base_url: str) -> Path:
    judge = {"backend": "openai", "base_url": base_url, "model": LLAMA_MODEL_ALIAS,
             "max_tokens": 2, "max_concurrency": 1}  # fmt: skip
    config = {
        "model": {"name_or_path": "smollm2-135m-instruct"},
        "data": {"train": str(tmp_path / "train.jsonl")},
        "rewards": [
            {"type": "checklist", "items": [{"name": "q", "question": "{completion} yes or no?"}],
             "judges": [judge]},
        ],
    }  # fmt: skip
    (tmp_path / "train.jsonl").write_text('{"prompt": "x"}\n')
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_pairwise_on_the_real_server(llama_server: LlamaServer, tmp_path: Path) -> None:
    folder = _eval_dir(tmp_path)
    (tmp_path / "pairwise.txt").write_text(RUBRIC)
    args = ["pairwise", str(folder), "--config", str(_config(tmp_path, llama_server.base_url)),
            "--model", "trained", "--against", "base", "--rubric-file",
            str(tmp_path / "pairwise.txt")]  # fmt: skip
    result = CliRunner().invoke(judge_cli, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "trained against base on 2 prompts" in result.output
    report = json.loads((folder / "pairwise.json").read_text())
    records = [json.loads(line) for line in (folder / "pairwise_replies.jsonl").open()]
    assert (report["pairs"], len(records)) == (4, 8)
    # Both orders of each pair, answered by the server.
    assert [r["shown_first"] for r in records] == ["trained", "base"] * 4
    assert all(r["error"] is None and isinstance(r["reply"], str) for r in records)
    asked = list(zip(records[::2], records[1::2], strict=True))
    for verdict, (first, second) in zip(report["verdicts"], asked, strict=True):
        p, q = first["p_first"], second["p_first"]
        assert verdict["x_first"] == p
        assert verdict["y_first"] == (None if q is None else pytest.approx(1.0 - q))
        assert (verdict["length_x"], verdict["length_y"]) == (7, 4)
    assert report["mean_length_x"] == 7 and report["mean_length_y"] == 4


def test_a_wrong_directory_or_label_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "pairwise.txt").write_text(RUBRIC)
    config = _config(tmp_path, "http://127.0.0.1:9/v1")
    base = ["pairwise", "--config", str(config), "--rubric-file", str(tmp_path / "pairwise.txt"),
            "--against", "base"]  # fmt: skip
    result = CliRunner().invoke(judge_cli, [*base, str(tmp_path), "--model", "trained"])
    assert result.exit_code != 0 and "completions.jsonl does not exist" in str(result.exception)
    folder = _eval_dir(tmp_path)
    result = CliRunner().invoke(judge_cli, [*base, str(folder), "--model", "trainde"])
    assert "no model 'trainde' in the eval's completions (it has: base, trained)" in str(
        result.exception
    )
