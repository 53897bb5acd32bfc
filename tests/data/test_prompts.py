"""Prompt sets: formats, columns for rewards, and row errors with file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit.data import check_columns, columns_of, encode_prompt, load_prompts, to_messages
from grpokit.errors import UserError


def test_jsonl_csv_and_datasets_dir_load_the_same_rows(tmp_path: Path) -> None:
    rows = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+3?", "answer": "5"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    (tmp_path / "p.csv").write_text("prompt,answer\n1+1?,2\n2+3?,5\n")
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    for name in ("p.jsonl", "p.csv", "ds"):
        loaded = load_prompts(tmp_path / name)
        assert [r.prompt for r in loaded] == ["1+1?", "2+3?"]
        assert columns_of(loaded) == {"answer": ["2", "5"]}


def test_chat_message_prompts(tmp_path: Path) -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": msgs}) + "\n")
    row = load_prompts(tmp_path / "p.jsonl")[0]
    assert row.prompt == msgs
    # A prompt with its own system message keeps it; the configured one is not added twice.
    assert to_messages(row.prompt, "other") == msgs
    assert to_messages("Q", "S") == msgs


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"prompt": "a"}\n{"prompt": "b"\n', r"p.jsonl:2: not valid JSON"),
        (
            '{"prompt": "a"}\n\n{"question": "b"}\n',
            r"p.jsonl:3: no 'prompt' value \(columns with values: question\)",
        ),
        ('{"prompt": ""}\n', r"p.jsonl:1: column 'prompt' is empty"),
        ('{"prompt": 3}\n', r"p.jsonl:1: .*non-empty string or a list of chat messages"),
        ('{"prompt": [{"role": "user"}]}\n', r"p.jsonl:1: message 0"),
        ("[1, 2]\n", r"p.jsonl:1: expected a JSON object"),
        ("", r"no prompts"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / "p.jsonl").write_text(content)
    with pytest.raises(UserError, match=expected):
        load_prompts(tmp_path / "p.jsonl")


def test_missing_reward_column_is_found_before_training(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n')
    rows = load_prompts(tmp_path / "p.jsonl")
    with pytest.raises(UserError, match=r"p.jsonl:2: the rewards need column\(s\) answer"):
        check_columns(rows, {"answer"}, "p.jsonl")


def test_encode_prompt_uses_chat_template_and_truncates_left(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = encode_prompt(tiny_tokenizer, "What is 2 + 2?", system_prompt="Be brief.")
    text = tiny_tokenizer.decode(ids)
    assert "Be brief." in text and "What is 2 + 2?" in text
    assert text.rstrip().endswith("assistant")  # generation prompt
    short = encode_prompt(
        tiny_tokenizer, "What is 2 + 2?", system_prompt="Be brief.", max_prompt_length=5
    )
    assert short == ids[-5:]
