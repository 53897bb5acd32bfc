"""`grpokit generate`: several models side by side, same seeds, scored by the config's rewards."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.errors import UserError
from grpokit.evaluate.generate import generate_samples, prompt_rows
from grpokit.rollout.base import SamplingParams

REWARDS = """
def letter_e(prompts, completions, **columns):
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [t.count("e") / max(1, len(t)) for t in texts]
"""


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def config(tmp_path: Path, tiny_model_dir: Path) -> Path:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    doc = {
        "model": {"name_or_path": str(tiny_model_dir), "device": "cpu"},
        "data": {"train": "unused.jsonl", "system_prompt": "You are terse."},
        "rewards": [
            {"type": "python", "name": "e", "function": "my_rewards.py:letter_e"},
            {"type": "regex_match", "name": "has_digit", "pattern": "[0-9]"},
        ],
        "training": {"max_completion_length": 6, "temperature": 1.0, "report_to": ["none"]},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_generate_cli_shows_models_side_by_side_with_rewards(
    config: Path, tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    base, trained = tiny_model_factory(seed=0), tiny_model_factory(seed=1)
    out = tmp_path / "samples.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "generate",
            "--model",
            f"base={base}",
            "--model",
            f"trained={trained}",
            "--prompt",
            "Say hello.",
            "--prompt",
            "Count to three.",
            "--samples",
            "2",
            "--config",
            str(config),
            "--out",
            str(out),
        ],  # fmt: skip
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "base" in result.output and "trained" in result.output
    assert "mean reward over all samples" in result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 * 2 * 2  # models x prompts x samples
    assert {r["model"] for r in records} == {"base", "trained"}
    assert {r["prompt"] for r in records} == {"Say hello.", "Count to three."}
    for r in records:
        # The config's rewards scored exactly the text shown.
        text = r["text"]
        assert r["rewards"]["e"] == pytest.approx(text.count("e") / max(1, len(text)), abs=1e-6)
        assert r["rewards"]["has_digit"] == (1.0 if any(c.isdigit() for c in text) else 0.0)
        assert r["total"] == pytest.approx(r["rewards"]["e"] + r["rewards"]["has_digit"], abs=1e-5)
        assert 1 <= r["length"] <= 6
    # Different weights, same seeds: the two models' samples differ.
    by_model = {m: [r["text"] for r in records if r["model"] == m] for m in ("base", "trained")}
    assert by_model["base"] != by_model["trained"]


def test_same_model_same_seed_gives_the_same_samples(
    tiny_model_dir: Path, tiny_model_factory: Callable[..., Path]
) -> None:
    """Every model is sampled with the same seeds: a model listed twice answers identically, so a
    difference between two models is the weights', not the randomness'."""
    rows = prompt_rows(None, ["Tell me a story.", "Why is the sky blue?"])
    sampling = SamplingParams(max_completion_length=8, temperature=1.0)
    kwargs: dict[str, Any] = {"samples": 3, "sampling": sampling, "device": "cpu", "log": print}
    result = generate_samples(
        [f"a={tiny_model_dir}", f"b={tiny_model_dir}"], rows, seed=5, batch_size=3, **kwargs
    )
    assert result.labels == ["a", "b"]
    for i in range(2):
        a = [s.text for s in result.of("a", i)]
        assert a == [s.text for s in result.of("b", i)]
        assert len(set(a)) > 1  # sampling, not greedy: the K samples differ
        assert all(s.rewards == {} and s.total is None for s in result.of("a", i))
    other = generate_samples([str(tiny_model_dir)], rows, seed=6, batch_size=3, **kwargs)
    assert [s.text for s in other.samples] != [
        s.text for s in result.of("a", 0) + result.of("a", 1)
    ]


def test_generate_reads_a_prompt_file_and_checks_reward_columns(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "What is 2+3?", "answer": "5"}) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(tiny_model_dir)},
                "data": {"train": "p.jsonl"},
                "rewards": [{"type": "math_answer", "name": "answer", "answer_column": "solution"}],
                "training": {"max_completion_length": 4},
            }
        )
    )
    result = CliRunner().invoke(
        main,
        [
            "generate",
            "--model",
            str(tiny_model_dir),
            "--prompts",
            str(prompts),
            "--config",
            str(cfg),
            "--samples",
            "1",
        ],  # fmt: skip
    )
    assert result.exit_code == 2
    assert "solution" in result.output


def test_prompt_texts_are_sampled_and_scored_by_the_rewards_that_need_no_column(
    config: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """--prompt texts have no columns: a reward that reads one (and one gated on it) does not
    score them, and the output says so, instead of refusing to sample."""
    doc = yaml.safe_load(config.read_text())
    doc["rewards"] += [
        {"type": "math_answer", "name": "answer", "answer_column": "solution"},
        {"type": "regex_match", "name": "digit_if_right", "pattern": "[0-9]",
         "gate": {"reward": "answer", "min": 1.0}},
    ]  # fmt: skip
    config.write_text(yaml.safe_dump(doc))
    out = tmp_path / "samples.jsonl"
    args = ["generate", "--model", str(tiny_model_dir), "--prompt", "What is 2+3?",
            "--samples", "2", "--config", str(config), "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert (
        "not scored: reward 'answer' needs the column(s) solution, which --prompt texts lack"
        in (result.output)
    )
    assert "not scored: reward 'digit_if_right' depends on 'answer', which is not scored" in (
        result.output
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2
    for r in records:  # the two rewards that need no column scored the text shown
        assert set(r["rewards"]) == {"e", "has_digit"}
        assert r["rewards"]["has_digit"] == (1.0 if any(c.isdigit() for c in r["text"]) else 0.0)


def test_prompt_sources_are_exclusive_and_required(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not both"):
        prompt_rows(tmp_path / "p.jsonl", ["hi"])
    with pytest.raises(UserError, match="--prompts FILE"):
        prompt_rows(None, [])
