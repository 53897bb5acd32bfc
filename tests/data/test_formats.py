"""Prompt sets as TRL takes them: every format `datasets.load_dataset` reads, hub-style folders
with configs and split slices, a columns map, and chat-message prompts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import yaml

from grpokit.config import load_config, load_prompt_rows
from grpokit.data import encode_prompt, load_prompts
from grpokit.data.sources import DatasetSource
from grpokit.errors import UserError

ROWS = [
    {"question": "1+1?", "solution": "2"},
    {"question": "2+3?", "solution": "5"},
    {"question": "4+4?", "solution": "8"},
]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]


def _write_every_format(d: Path) -> dict[str, Path]:
    """The same three rows in each local form `datasets` reads."""
    d.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r) + "\n" for r in ROWS)
    (d / "p.jsonl").write_text(lines)
    (d / "lines.json").write_text(lines)
    (d / "array.json").write_text(json.dumps(ROWS))
    (d / "p.csv").write_text("question,solution\n1+1?,2\n2+3?,5\n4+4?,8\n")
    # Excel writes UTF-8 CSV with a byte-order mark and CRLF line ends.
    (d / "excel.csv").write_bytes(
        b"\xef\xbb\xbfquestion,solution\r\n1+1?,2\r\n2+3?,5\r\n4+4?,8\r\n"
    )
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(d / "p.parquet"))
    ds.save_to_disk(str(d / "saved"))
    shutil.copy(next((d / "saved").glob("*.arrow")), d / "p.arrow")
    (d / "folder").mkdir()
    (d / "folder" / "a.jsonl").write_text(lines.splitlines(keepends=True)[0])
    (d / "folder" / "b.jsonl").write_text("".join(lines.splitlines(keepends=True)[1:]))
    return {
        name: d / name
        for name in (
            "p.jsonl",
            "lines.json",
            "array.json",
            "p.csv",
            "excel.csv",
            "p.parquet",
            "p.arrow",
            "saved",
            "folder",
        )
    }


def test_every_local_format_gives_the_same_rows(tmp_path: Path) -> None:
    columns = {"question": "prompt", "solution": "answer"}
    for name, path in _write_every_format(tmp_path).items():
        rows = load_prompts(path, columns=columns)
        assert [r.prompt for r in rows] == ["1+1?", "2+3?", "4+4?"], name
        # CSV is read as text (no number guessing): the same strings as the JSON files.
        assert [r.columns for r in rows] == [{"answer": s} for s in ("2", "5", "8")], name


def test_hub_style_folder_with_configs_splits_and_revision_free_slices(tmp_path: Path) -> None:
    # The layout of a hub dataset repository, read through datasets' own local loading.
    repo = tmp_path / "repo"
    for config, rows in (("en", ROWS), ("ja", [{"question": "いち?", "solution": "1"}] * 2)):
        (repo / config).mkdir(parents=True)
        for split in ("train", "test"):
            (repo / config / f"{split}.jsonl").write_text(
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            )
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: en\n  data_files:\n  - {split: train, path: en/train.jsonl}\n"
        "  - {split: test, path: en/test.jsonl}\n- config_name: ja\n  data_files:\n"
        "  - {split: train, path: ja/train.jsonl}\n  - {split: test, path: ja/test.jsonl}\n---\n"
    )
    cols = {"question": "prompt"}
    rows = load_prompts(DatasetSource(str(repo), name="en", split="test[1:]"), columns=cols)
    assert [r.prompt for r in rows] == ["2+3?", "4+4?"]
    assert [r.prompt for r in load_prompts(DatasetSource(str(repo), name="ja"), columns=cols)] == [
        "いち?",
        "いち?",
    ]
    with pytest.raises(UserError, match=r"repo: `datasets` could not read this folder: .*'fr'"):
        load_prompts(DatasetSource(str(repo), name="fr"), columns=cols)
    # data_files picks files inside a folder, as load_dataset's argument does.
    rows = load_prompts(
        DatasetSource(str(repo), data_files="ja/test.jsonl", split="train"), columns=cols
    )
    assert len(rows) == 2


def test_config_mapping_form_slices_and_columns(tmp_path: Path) -> None:
    paths = _write_every_format(tmp_path)
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}
    ).save_to_disk(str(tmp_path / "dict"))
    doc = {
        "data": {
            "train": {"path": "dict", "split": "train[:2]"},
            "heldout": {"path": paths["p.parquet"].name, "split": "train[-1:]"},
            "columns": {"question": "prompt", "solution": "answer"},
        },
        "rewards": [{"type": "math_answer", "answer_column": "answer"}],
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(doc))
    cfg = load_config(tmp_path / "config.yaml")
    assert [r.prompt for r in load_prompt_rows(cfg, "train")] == ["1+1?", "2+3?"]
    assert [r.columns for r in load_prompt_rows(cfg, "heldout")] == [{"answer": "8"}]
    # The string form keeps working and resolves against the config's directory.
    cfg = load_config(tmp_path / "config.yaml", ["data.train=p.csv", "data.heldout=null"])
    assert len(load_prompt_rows(cfg, "train")) == 3
    with pytest.raises(UserError, match="data.heldout is not set"):
        load_prompt_rows(cfg, "heldout")


def test_conversational_and_plain_prompts_in_any_format(tmp_path: Path) -> None:
    rows = [{"prompt": CHAT, "answer": "x"}, {"prompt": "plain text", "answer": "y"}]
    datasets.Dataset.from_list([rows[0]]).to_parquet(str(tmp_path / "chat.parquet"))
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_prompts(tmp_path / "chat.parquet")[0].prompt == CHAT
    loaded = load_prompts(tmp_path / "mixed.jsonl")
    assert [r.prompt for r in loaded] == [CHAT, "plain text"]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("p.csv", b"prompt,answer\na,1\nb,2,3\n", r"p.csv:3: 3 fields, but the header has 2"),
        ("p.csv", b'prompt,answer\n"two\nlines",1\nb\n', r"p.csv:4: 1 fields, but the header"),
        ("p.csv", b"prompt,prompt\na,b\n", r"p.csv:1: column 'prompt' appears twice"),
        (
            "p.jsonl",
            '{"prompt": "café"}\n'.encode("latin-1"),
            r"p.jsonl: not UTF-8 text: byte "
            r"0xe9 at offset 15 \(line 1\)",
        ),
        (
            "p.csv",
            "prompt\nnaïve\n".encode("latin-1"),
            r"p.csv: not UTF-8 text: byte 0xef at "
            r"offset 9 \(line 2\)",
        ),
        (
            "p.jsonl",
            b'{"prompt": [{"role": "human", "content": "hi"}]}\n',
            r"p.jsonl:1: message 0 "
            r"of 'prompt' has role 'human'; use one of system, user, assistant, tool",
        ),
        (
            "p.jsonl",
            b'{"prompt": "a"}\n{"prompt": [{"role": "assistant", "content": "x"}]}\n',
            r"p.jsonl:2: the messages of 'prompt' have no user message \(roles: assistant\)",
        ),
        (
            "p.jsonl",
            b'{"prompt": "a"}\n{"prompt": "b"} {"prompt": "c"}\n',
            r"p.jsonl:2: not valid "
            r"JSON \(Extra data",
        ),
        ("p.json", b'[{"prompt": "a"}, 3]', r"p.json: array element 2: expected a JSON object"),
        ("p.json", b'{"prompt": "a",\n "x": }', r"p.json:2: not valid JSON"),
        ("p.txt", b"prompt\n", r"p.txt: unknown data file type '.txt'"),
        ("p.parquet", b"not parquet", r"p.parquet: `datasets` could not read it as parquet"),
    ],
)
def test_bad_files_give_file_and_line(
    tmp_path: Path, name: str, content: bytes, expected: str
) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UserError, match=expected):
        load_prompts(tmp_path / name)


def test_excel_bom_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    (tmp_path / "p.csv").write_bytes(b"\xef\xbb\xbfprompt,answer\r\nhi,1\r\n")
    row = load_prompts(tmp_path / "p.csv")[0]
    assert (row.prompt, row.columns) == ("hi", {"answer": "1"})
    (tmp_path / "q.csv").write_bytes(b"\xef\xbb\xbfquestion\r\nhi\r\n")
    with pytest.raises(UserError) as e:
        load_prompts(tmp_path / "q.csv")
    assert "(columns: question)" in str(e.value) and "\ufeff" not in str(e.value)


def test_columns_map_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"q": "a"}\n')
    with pytest.raises(UserError, match=r"data.columns renames 'question', which the data does "):
        load_prompts(tmp_path / "p.jsonl", columns={"question": "prompt"})
    with pytest.raises(UserError, match=r"p.jsonl:1: no 'prompt' column \(columns: q\)"):
        load_prompts(tmp_path / "p.jsonl")


def test_hub_name_offline_names_the_dataset(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "data:\n  train: {path: someone/some-prompts, name: main, split: 'train[:500]'}\n"
        "rewards:\n  - type: xml_format\n"
    )
    code = (
        "from grpokit.config import load_config, load_prompt_rows\n"
        "from grpokit.errors import UserError\n"
        "try:\n"
        f"    load_prompt_rows(load_config({str(tmp_path / 'config.yaml')!r}), 'train')\n"
        "except UserError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "dataset 'someone/some-prompts' (config 'main', split 'train[:500]')" in out.stdout
    assert "HF_HUB_OFFLINE" in out.stdout and "save_to_disk" in out.stdout


def test_missing_path_that_is_no_hub_name(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nope.jsonl: no such file or folder"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match="no such file or folder"):
        load_prompts("missing-file.csv")
    # A file type `datasets` does not read, or any suffix on a name without an owner: a missing
    # file, not a hub dataset to look up (offline that lookup retries for over 20 s).
    for name in ("train.xlsx", "prompts.v2", "someone/prompts.tsv"):
        with pytest.raises(UserError, match="no such file or folder"):
            load_prompts(name)


def test_chat_template_kwargs_reach_the_template(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tiny_tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant (thinking ' ~ (enable_thinking | default(true))"
        " ~ '):' }}{% endif %}"
    )
    on = tiny_tokenizer.decode(encode_prompt(tiny_tokenizer, "Q"))
    off = tiny_tokenizer.decode(
        encode_prompt(tiny_tokenizer, "Q", chat_template_kwargs={"enable_thinking": False})
    )
    assert on.endswith("assistant (thinking True):") and off.endswith("(thinking False):")
