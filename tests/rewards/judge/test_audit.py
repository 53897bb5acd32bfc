"""The judge audit: planted answers, statistics and the CLI, with a scripted judge server."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from grpokit.errors import UserError
from grpokit.recipes import recipe_dir
from grpokit.rewards.audit.judge import read_completions, separation
from grpokit.rewards.audit.planted import planted_answers, rubric_keywords
from grpokit.rewards.builtin.format import xml_format_score
from grpokit.rewards.judge.cli import judge_cli
from grpokit.rewards.judge.reward import START_COMPLETION
from grpokit.rewards.judge.rubric import load_rubric

from .conftest import Answer, FakeJudge

RECIPE = recipe_dir("business-ideas")


def test_rubric_keywords_of_the_recipe() -> None:
    ja = load_rubric(None, "rubric_ja.txt", RECIPE, "rubric_file")
    en = load_rubric(None, "rubric_en.txt", RECIPE, "rubric_file")
    assert rubric_keywords(en) == [
        "Revenue model", "Concrete customer", "Clear product", "Sensible KPIs",
        "Convincing advantage",
    ]  # fmt: skip
    keywords = rubric_keywords(ja)
    assert len(keywords) == 5
    assert keywords[0] == "収益モデル"
    assert any("KPI" in k for k in keywords)


def test_planted_answers_pass_the_format_gate() -> None:
    rubric = load_rubric(None, "rubric_ja.txt", RECIPE, "rubric_file")
    prompt = "ターゲット：地方の高齢者。 技術：生成AIと音声認識。"
    answers = planted_answers(prompt, rubric, ["thinking", "proposal"], random.Random(0))
    assert set(answers) == {"gibberish", "empty", "prompt_copy", "repetitive", "keyword_list"}
    for text in answers.values():
        assert xml_format_score(text, ["thinking", "proposal"]) == 1.0
    assert prompt in answers["prompt_copy"]
    assert "収益モデル" in answers["keyword_list"]
    assert answers["repetitive"].count(prompt) >= 3
    again = planted_answers(prompt, rubric, ["thinking", "proposal"], random.Random(0))
    assert again == answers  # seeded


def test_separation_is_the_share_of_pairs_ranked_right() -> None:
    # (0.9 > 0.1), (0.9 > 0.5), (0.5 > 0.1) and the tie (0.5 = 0.5) counting half: 3.5 of 4.
    assert separation([0.9, 0.5], [0.1, 0.5, math.nan]) == pytest.approx(0.875)
    assert separation([0.1], [0.9]) == 0.0
    assert separation([0.3, 0.3], [0.3]) == 0.5  # a constant judge: chance
    assert math.isnan(separation([math.nan], [0.1]))


def test_read_completions_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"prompt": "p", "completion": "c"}\n{"prompt": "p"\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"c\.jsonl:2: not valid JSON"):
        read_completions(path)
    path.write_text('{"prompt": "p", "answer": "c"}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"c\.jsonl:1: .*completion"):
        read_completions(path)
    with pytest.raises(UserError, match="does not exist"):
        read_completions(tmp_path / "missing.jsonl")
    path.write_bytes('{"prompt": "p", "completion": "café"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match=r"c\.jsonl: not UTF-8 text: byte 0xe9 at byte offset 34"):
        read_completions(path)


def _config(tmp_path: Path, *judges: dict[str, Any]) -> Path:
    import yaml

    config = {
        "model": {"name_or_path": "smollm2-135m-instruct"},
        "data": {"train": "train.jsonl"},
        "rewards": [
            {"type": "xml_format", "tags": ["thinking", "proposal"]},
            {
                "type": "judge",
                "name": "quality",
                "gate": {"reward": "xml_format", "min": 1.0},
                "rubric_file": "rubric.txt",
                "judges": list(judges),
            },
        ],
    }
    (tmp_path / "rubric.txt").write_text(
        "Score 0-1.\n- Revenue model: +0.2 points\n- Customer: +0.2 points\n{completion}",
        encoding="utf-8",
    )
    (tmp_path / "train.jsonl").write_text('{"prompt": "p"}\n', encoding="utf-8")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_audit_reports_noise_agreement_and_planted(
    fake_judge: Callable[..., FakeJudge], tmp_path: Path
) -> None:
    def gullible(request: dict[str, Any], n: int) -> Answer:
        text = request["messages"][0]["content"]
        if "- Revenue model\n- Customer" in text:  # the keyword list fools this judge
            return Answer(content="0.9")
        if "<proposal>\n\n</proposal>" in text or START_COMPLETION in text:
            return Answer(content="no score")
        # Real answers: noisy, alternating between repeats.
        return Answer(content="0.4" if n % 2 else "0.6")

    first = fake_judge(gullible)
    second = fake_judge(lambda request, n: Answer(content="0.1"))
    judge = {"backend": "openai", "model": "fake-judge", "backoff_s": 0.01}
    config = _config(
        tmp_path,
        {**judge, "base_url": first.base_url, "name": "a", "max_concurrency": 1},
        {**judge, "base_url": second.base_url, "name": "b"},
    )
    completions = tmp_path / "completions.jsonl"
    rows = [
        {"prompt": "topic one", "completion": "<thinking>x</thinking><proposal>y</proposal>"},
        {"prompt": "topic two", "completion": "<thinking>z</thinking><proposal>w</proposal>"},
    ]
    completions.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    output = tmp_path / "report.json"
    result = CliRunner().invoke(
        judge_cli,
        ["audit", str(config), "--completions", str(completions), "--k", "2",
         "--planted-prompts", "1", "--output", str(output)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "planted bad answers" in result.output
    report = json.loads(output.read_text())
    assert report["items"] == 2 and report["k"] == 2
    a, b = report["judges"]
    assert a["label"] == "a" and b["label"] == "b"
    assert a["noise"] > 0.0  # judge a wavers between repeats
    assert b["noise"] == 0.0
    # The reward averages them: (0.4 + 0.1) / 2 and (0.6 + 0.1) / 2 on the two repeats.
    assert a["noise"] == pytest.approx(0.1)
    assert report["reward_noise"] == pytest.approx(0.05)
    assert b["mean"] == pytest.approx(0.1)
    assert report["disagreement"] is not None and report["disagreement"] > 0.0
    planted = {p["kind"]: p for p in report["planted"]}
    assert planted["keyword_list"]["per_judge"]["a"] == pytest.approx(0.9)
    assert planted["keyword_list"]["verdict"] == "hackable"
    # Judge a never scored the empty answer (a parse failure, not a 0): only b's 0.1 counts.
    assert math.isnan(planted["empty"]["per_judge"]["a"])
    assert planted["empty"]["mean"] == pytest.approx(0.1)
    # Item means over judges: real answers 0.3 (a: 0.4 and 0.6 on its two repeats, b: 0.1);
    # planted: the keyword list 0.5 (beats them), the empty one 0.1 (loses), the other three
    # 0.3 (ties). (0 + 1 + 3 x 0.5) / 5 pairs per real answer: no better than chance.
    assert report["separation"] == pytest.approx(0.5)
    assert "separation: P(real answer scored above a planted one)" in result.output
    assert a["parse_failure_rate"] == pytest.approx(2 / 14)
    assert b["parse_failure_rate"] == 0.0
    # The start-up sample, then 2 real + 5 planted items, 2 repeats; nothing cached between
    # repeats. Judge a's start-up reply held no score: an audit goes on (it measures that).
    assert len(first.requests) == 1 + 14 and len(second.requests) == 1 + 14


def test_audit_needs_a_judge_reward(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "config.yaml"
    (tmp_path / "train.jsonl").write_text('{"prompt": "p"}\n', encoding="utf-8")
    path.write_text(
        yaml.safe_dump({"data": {"train": "train.jsonl"}, "rewards": [{"type": "xml_format"}]}),
        encoding="utf-8",
    )
    completions = tmp_path / "c.jsonl"
    completions.write_text('{"prompt": "p", "completion": "c"}\n', encoding="utf-8")
    from grpokit.rewards.judge.cli import run_audit

    with pytest.raises(UserError, match="no entry of type judge"):
        run_audit(path, completions)
