"""Progress of long commands: log lines with an ETA off a terminal, nothing when disabled."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpokit.progress import Progress, eta_text, progress


def test_eta_text() -> None:
    assert [eta_text(s) for s in (0, 44.6, 200, 3900)] == [
        "0 s",
        "45 s",
        "3 min 20 s",
        "1 h 05 min",
    ]


def test_log_lines_off_a_terminal_name_the_count_and_the_time_left() -> None:
    lines: list[str] = []
    with progress("eval base", 4, live=False, log=lines.append) as bar:
        bar.every = 0.0  # a line per item here; 30 s apart in a real run
        for i in range(4):
            bar.advance(1, f"item {i}")
    assert lines[0].startswith("eval base: 1/4 (item 0), about ")
    assert lines[-1] == "eval base: 4/4 (item 3)"  # the last line needs no ETA
    assert len(lines) == 4


def test_lines_are_throttled_but_the_first_and_last_always_show() -> None:
    lines: list[str] = []
    tracker = Progress("sft", 100, log=lines.append, every=3600.0)
    for _ in range(100):
        tracker.advance()
    assert [line.split(":")[1].split()[0].rstrip(",") for line in lines] == ["1/100", "100/100"]


def test_a_resumed_count_starts_where_it_was_and_disabled_prints_nothing() -> None:
    lines: list[str] = []
    with progress("GRPO", 10, done=6, live=False, log=lines.append) as bar:
        bar.advance(1)
    assert lines == [lines[0]] and lines[0].startswith("GRPO: 7/10")
    with progress("GRPO", 10, enabled=False, log=lines.append) as quiet:
        quiet.advance(5)
    assert len(lines) == 1


def test_eval_reports_progress_per_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    import json

    import yaml

    from grpokit.evaluate.eval import run_eval

    prompts = tmp_path / "heldout.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Say {w}."}) + "\n" for w in "abc"))
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(tiny_model_dir)},
                "data": {"train": "heldout.jsonl"},
                "rewards": [{"type": "xml_format"}],
                "training": {"max_completion_length": 4},
            }
        )
    )
    lines: list[str] = []
    run_eval(
        [f"a={tiny_model_dir}"],
        prompts,
        samples=1,
        out_dir=tmp_path / "out",
        config=config,
        batch_size=1,
        log=lines.append,
    )
    assert any(line.startswith("a: 1/3") for line in lines), lines
    assert any(line.startswith("a: 3/3") for line in lines), lines


@pytest.mark.parametrize("total", [0, 1])
def test_small_totals(total: int) -> None:
    lines: list[str] = []
    with progress("x", total, live=False, log=lines.append) as bar:
        for _ in range(total):
            bar.advance()
    assert len(lines) == total
