"""`grpokit rewards check`: scoring a JSONL of completions with a config's rewards."""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from grpokit.cli import main
from grpokit.errors import UserError
from grpokit.rewards import check_completions
from grpokit.rewards.audit.check import format_table
from grpokit.rewards.spec import parse_reward_specs

REWARDS_YAML = """\
rewards:
  - type: xml_format
    tags: [thinking, answer]
  - type: math_answer
    name: correct
    weight: 2.0
    gate: {reward: xml_format, min: 1.0}
  - type: python
    function: my_rewards.py:brevity
"""

MY_REWARDS = "def brevity(prompts, completions, **kw):\n    return [-len(str(c)) / 100 for c in completions]\n"

ROWS: list[dict[str, Any]] = [
    {"prompt": "2+2?", "completion": "<thinking>add</thinking><answer>4</answer>", "answer": "4"},
    {"prompt": "2+3?", "completion": "<thinking>add</thinking><answer>6</answer>", "answer": "5"},
    {"completion": [{"role": "assistant", "content": "it is 4"}], "answer": "4"},
]


def write_files(
    tmp_path: Path, yaml_text: str = REWARDS_YAML, rows: list[dict[str, Any]] | None = None
) -> tuple[Path, Path]:
    config = tmp_path / "config.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS, encoding="utf-8")
    completions = tmp_path / "samples.jsonl"
    completions.write_text(
        "\n".join(json.dumps(r, ensure_ascii=False) for r in (rows or ROWS)) + "\n",
        encoding="utf-8",
    )
    return config, completions


def test_check_completions_scores_and_table(tmp_path: Path) -> None:
    _, completions = write_files(tmp_path)
    import yaml

    specs = parse_reward_specs(yaml.safe_load(REWARDS_YAML)["rewards"])
    result = check_completions(specs, completions, base_dir=tmp_path)
    scores, rows = result.scores, result.rows
    assert rows == ROWS and result.warnings == []
    assert scores.names == ["xml_format", "correct", "brevity"]
    assert scores.column("xml_format") == [1.0, 1.0, 0.0]
    assert scores.column("correct") == [1.0, 0.0, 0.0]
    assert scores.gated_out[:, 1].tolist() == [False, False, True]
    console = Console(width=200, record=True)
    console.print(format_table(scores, rows, max_chars=30))
    text = console.export_text()
    assert "correct" in text and "brevity" in text and "0 (gated)" in text
    assert "<thinking>add</thinking>" in text and "…" in text  # one line, cut at 30 chars


def test_cli_with_rewards_only_yaml(tmp_path: Path) -> None:
    config, completions = write_files(tmp_path)
    result = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions), "--json"]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [line["rewards"]["correct"] for line in lines] == [1.0, 0.0, 0.0]
    assert lines[2]["gated_out"] == ["correct"]
    assert lines[0]["total"] == pytest.approx(1.0 + 2.0 - len(ROWS[0]["completion"]) / 100)
    table = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions)]
    )
    assert table.exit_code == 0 and "reward check" in table.output


def test_cli_with_full_config(tmp_path: Path) -> None:
    full = "data:\n  train: prompts.jsonl\n" + REWARDS_YAML
    config, completions = write_files(tmp_path, full)
    result = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) == 3


@pytest.mark.parametrize(
    ("yaml_text", "rows", "message"),
    [
        ("rewards:\n  - type: nope\n", None, "unknown reward type 'nope'"),
        (
            "rewards:\n  - type: math_answer\n    answer_column: gold\n",
            None,
            "needs the column\\(s\\) gold",
        ),
        (
            "rewards:\n  - type: xml_format\n    gate: {reward: correct}\n",
            None,
            "gated on 'correct'",
        ),
        (REWARDS_YAML, [{"prompt": "no completion key"}], "samples.jsonl:1: no `completion` key"),
    ],
)
def test_cli_errors_exit_2(
    tmp_path: Path, yaml_text: str, rows: list[dict[str, Any]] | None, message: str
) -> None:
    config, completions = write_files(tmp_path, yaml_text, rows)
    result = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions)]
    )
    assert result.exit_code == 2, result.output
    assert re.search(message, result.output), result.output


def test_bad_jsonl_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"completion": "a"}\n{oops\n', encoding="utf-8")
    with pytest.raises(UserError, match="bad.jsonl:2: not valid JSON"):
        check_completions(parse_reward_specs([{"type": "xml_format"}]), path, base_dir=tmp_path)


BROKEN_REWARDS = """\
def picky(prompts, completions, **kw):
    return [1.0 / len(str(c)) for c in completions]

def short(prompts, completions, **kw):
    return [0.0] * (len(completions) - 1)

def batch_only(prompts, completions, **kw):
    if len(completions) > 1:
        raise RuntimeError("cannot score batches")
    return [0.0]
"""


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (
            "picky",
            r"^error: reward 'picky' raised ZeroDivisionError: float division by zero \(at "
            r".*broken\.py:2 in (<listcomp>|picky)\) on row 2 \(.*samples\.jsonl:3\)\n$",
        ),
        (
            "short",
            r"^error: reward 'short' returned 2 values for 3 completions; it must return "
            r"exactly one value \(float or None\) per completion \(scoring the 3 completions\)\n$",
        ),
        (
            "batch_only",
            r"^error: reward 'batch_only' raised RuntimeError: cannot score batches \(at "
            r".*broken\.py:9 in batch_only\) on the batch of 3 completions \(on no single row",
        ),
    ],
)
def test_misbehaving_reward_is_one_message(tmp_path: Path, function: str, message: str) -> None:
    (tmp_path / "broken.py").write_text(BROKEN_REWARDS, encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"rewards:\n  - type: xml_format\n  - type: python\n    function: broken.py:{function}\n",
        encoding="utf-8",
    )
    completions = tmp_path / "samples.jsonl"
    # Line 2 is blank: the row numbers of the table and the file's line numbers differ.
    completions.write_text('{"completion": "a"}\n\n{"completion": ""}\n{"completion": "b"}\n')
    result = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions)]
    )
    assert result.exit_code == 2, result.output
    assert re.search(message, result.stderr), result.stderr
    assert "Traceback" not in result.output and result.stdout == ""


def test_non_utf8_files_name_the_byte_offset(tmp_path: Path) -> None:
    config, completions = write_files(tmp_path)
    good = completions.read_bytes()
    completions.write_bytes(good + '{"completion": "café"}\n'.encode("latin-1"))
    result = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions)]
    )
    assert result.exit_code == 2, result.output
    offset = len(good) + len('{"completion": "caf')
    assert (
        f"{completions}: not UTF-8 text: byte 0xe9 at byte offset {offset} (line 4)"
        in result.stderr
    )
    assert "iconv" in result.stderr

    config.write_bytes("# réglages\n".encode("latin-1") + REWARDS_YAML.encode())
    completions.write_bytes(good)
    result = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions)]
    )
    assert result.exit_code == 2, result.output
    assert f"{config}: not UTF-8 text: byte 0xe9 at byte offset 3 (line 1)" in result.stderr
    # With a byte-order mark (read and skipped), offsets still count from the file's start.
    config.write_bytes(codecs.BOM_UTF8 + "# réglages\n".encode("latin-1"))
    result = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions)]
    )
    assert f"{config}: not UTF-8 text: byte 0xe9 at byte offset 6 (line 1)" in result.stderr


def test_byte_order_mark_is_read(tmp_path: Path) -> None:
    config, completions = write_files(tmp_path)
    config.write_bytes(codecs.BOM_UTF8 + config.read_bytes())
    completions.write_bytes(codecs.BOM_UTF8 + completions.read_bytes())
    result = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == len(ROWS)
