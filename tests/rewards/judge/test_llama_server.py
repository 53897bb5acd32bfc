"""The openai backend against a real llama.cpp OpenAI-compatible server serving the embedded
SmolLM2 GGUF (skipped only when xllamacpp is not installed)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from grpokit.recipes import recipe_dir
from grpokit.rewards.judge import JudgeParams, build_judge_reward
from tests.rewards.results import evaluate, judged

from .conftest import LLAMA_MODEL_ALIAS, LlamaServer

# A rubric the 135M model answers with a number ("Rating: 1"); the seed's rubric is too much
# for it (the audit shows that), which is not what these tests are about.
RUBRIC = (
    "Rate the following business idea on a scale from 1 to 5. Answer with a single digit only."
    "\n\nIdea: {completion}\n\nRating (1-5):"
)
IDEAS = [
    "A subscription service delivering healthy meals to busy office workers for 30 USD a week.",
    "An app.",
]
RECIPE = recipe_dir("business-ideas")


def llama_judge(server: LlamaServer, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "openai",
        "base_url": server.base_url,
        "model": LLAMA_MODEL_ALIAS,
        "max_tokens": 8,
        "backoff_s": 0.05,
        **extra,
    }


def test_number_and_expected_scores_come_back(llama_server: LlamaServer, tmp_path: Path) -> None:
    params = JudgeParams.model_validate(
        {"rubric": RUBRIC, "score_range": [1, 5], "judges": [llama_judge(llama_server)]}
    )
    number = build_judge_reward(params, tmp_path, tmp_path)
    try:
        result = evaluate(number, ["topic"] * 2, IDEAS)
        number_scores = result.values
        metrics = result.metrics
    finally:
        number.close()
    assert metrics["judge/request_failure_rate"] == 0.0
    assert any(s is not None for s in number_scores)
    assert all(s is None or 0.0 <= s <= 1.0 for s in number_scores)

    expected = build_judge_reward(
        params.model_copy(update={"mode": "expected"}), tmp_path, tmp_path
    )
    try:
        result = evaluate(expected, ["topic"] * 2, IDEAS)
        expected_scores = result.values
        metrics = result.metrics
        outcomes = judged(result).outcomes[0]
    finally:
        expected.close()
    # The server returned logprobs and they were used: no fallback to the written number.
    assert metrics["judge/expected_fallback_rate"] == 0.0
    assert metrics["judge/request_failure_rate"] == 0.0
    assert metrics["judge/cache_hit_rate"] == 0.0  # another mode is another cache key
    scored = [(n, e) for n, e in zip(number_scores, expected_scores, strict=True) if e is not None]
    assert scored
    assert all(0.0 <= e <= 1.0 for _, e in scored)
    # The small judge is unsure: the weighted score lies between the digits, unlike the sample.
    assert any(n is None or abs(n - e) > 1e-3 for n, e in scored)
    assert all(o.reply is not None and o.error is None for o in outcomes)


def test_extra_body_reaches_the_server(llama_server: LlamaServer, tmp_path: Path) -> None:
    # llama.cpp's own request field `grammar`, passed through: every reply is one digit 1-5,
    # where the same model without it writes "Rating: 1" and more.
    judge = llama_judge(llama_server, extra_body={"grammar": "root ::= [1-5]"})
    params = JudgeParams.model_validate(
        {"rubric": RUBRIC, "score_range": [1, 5], "cache": False, "judges": [judge]}
    )
    reward = build_judge_reward(params, tmp_path, tmp_path)
    try:
        result = evaluate(reward, ["topic"] * 2, IDEAS)
        scores = result.values
        replies = [o.reply for o in judged(result).outcomes[0]]
        metrics = result.metrics
    finally:
        reward.close()
    assert all(reply is not None and re.fullmatch(r"[1-5]", reply) for reply in replies), replies
    assert metrics["judge/parse_failure_rate"] == 0.0 and judged(result).warning is None
    assert all(s is not None and 0.0 <= s <= 1.0 for s in scores)


def test_timeout_then_server_stopped_mid_run(
    start_llama_server: Callable[[], LlamaServer], tmp_path: Path
) -> None:
    server = start_llama_server()
    params = JudgeParams.model_validate(
        {
            "rubric": RUBRIC,
            "score_range": [1, 5],
            "cache": False,
            "judges": [llama_judge(server, max_retries=1, timeout_s=60)],
        }
    )
    reward = build_judge_reward(params, tmp_path, tmp_path)
    try:
        result = evaluate(reward, ["topic"], IDEAS[:1])
        first = result.values
        assert result.metrics["judge/request_failure_rate"] == 0.0
        assert first[0] is None or 0.0 <= first[0] <= 1.0

        # A long answer cannot be written in 0.2 s: the request is abandoned at the timeout.
        slow_params = params.model_copy(
            update={
                "rubric": "Write a long essay about this idea: {completion}",
                "judges": [
                    # No start-up check: it would stop at the same timeout, at build time.
                    params.judges[0].model_copy(
                        update={
                            "timeout_s": 0.2,
                            "max_retries": 0,
                            "max_tokens": 512,
                            "check_at_start": False,
                        }
                    )
                ],
            }
        )
        slow = build_judge_reward(slow_params, tmp_path, tmp_path)
        try:
            result = evaluate(slow, ["topic"], IDEAS[:1])
            assert result.values == [None]
            assert "timeout after 0.2 s" in (judged(result).outcomes[0][0].error or "")
            assert result.metrics["judge/request_failure_rate"] == 1.0
        finally:
            slow.close()

        server.stop()
        # Training goes on: no exception, the scores are None and the failure is counted.
        for _ in range(2):
            result = evaluate(reward, ["topic"] * 2, IDEAS)
            assert result.values == [None, None]
            assert result.metrics["judge/request_failure_rate"] == 1.0
            assert result.metrics["judge/none_rate"] == 1.0
        assert "ConnectError" in (judged(result).outcomes[0][0].error or "")
    finally:
        reward.close()


def _recipe_copy(tmp_path: Path, base_url: str) -> Path:
    """The recipe's OpenAI config and files, pointed at the test server (English files: the
    Japanese rubric costs the 135M judge three times the tokens)."""
    for path in RECIPE.iterdir():
        shutil.copy(path, tmp_path / path.name)
    text = (RECIPE / "config.openai.yaml").read_text(encoding="utf-8")
    text = text.replace("http://127.0.0.1:8080/v1", base_url).replace("_ja.", "_en.")
    config = tmp_path / "config.openai.yaml"
    config.write_text(text, encoding="utf-8")
    return config


@pytest.mark.parametrize(
    "name",
    [
        "config.openai.en.yaml",
        # The Japanese rubric is about 700 tokens for the judge: seconds to minutes on 2 cores.
        pytest.param("config.openai.yaml", marks=pytest.mark.slow),
    ],
)
def test_the_recipes_server_judge_answers_with_a_score(
    llama_server: LlamaServer, tmp_path: Path, name: str
) -> None:
    from grpokit.config import load_config
    from grpokit.rewards.audit.common import pick_reward

    for path in RECIPE.iterdir():
        shutil.copy(path, tmp_path / path.name)
    config = tmp_path / name
    text = config.read_text(encoding="utf-8").replace(
        "http://127.0.0.1:8080/v1", llama_server.base_url
    )
    config.write_text(text, encoding="utf-8")
    cfg = load_config(config)
    entry = pick_reward(cfg.rewards, "judge", None, source=str(config))
    assert isinstance(entry.params, JudgeParams)
    # Building it runs the start-up check: one real request whose reply must hold a score (the
    # seed's own rubric gets none from the 135M model, which stopped the run with exit 2).
    reward = build_judge_reward(entry.params, cfg.config_dir, tmp_path)
    row = json.loads((RECIPE / "audit_en.jsonl").read_text(encoding="utf-8").splitlines()[0])
    try:
        result = evaluate(reward, [row["prompt"]], [row["completion"]])
        scores = result.values
        metrics = result.metrics
    finally:
        reward.close()
    assert scores[0] is not None and 0.0 <= scores[0] <= 1.0
    assert metrics["judge/parse_failure_rate"] == 0.0
    assert metrics["judge/request_failure_rate"] == 0.0


@pytest.mark.slow  # 12 judge requests: seconds on an idle machine, minutes on a busy 2-core one
def test_audit_runs_on_the_recipe(llama_server: LlamaServer, tmp_path: Path) -> None:
    from grpokit.rewards.judge.cli import judge_cli

    config = _recipe_copy(tmp_path, llama_server.base_url)
    completions = tmp_path / "completions.jsonl"
    row = {
        "prompt": json.loads((RECIPE / "heldout_en.jsonl").read_text().splitlines()[0])["prompt"],
        "completion": "<thinking>\nDowntime is expensive.\n</thinking>\n<proposal>\nSensor kits "
        "with anomaly alerts, 200 USD a month per line, for plants with 20-100 workers. KPI: "
        "unplanned downtime hours.\n</proposal>",
    }
    completions.write_text(json.dumps(row) + "\n", encoding="utf-8")
    report = tmp_path / "audit.json"
    result = CliRunner().invoke(
        judge_cli,
        [
            "audit", str(config), "--completions", str(completions), "--k", "2",
            "--planted-prompts", "1", "--output", str(report),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "judges (real completions)" in result.output
    assert "planted bad answers" in result.output
    for kind in ("gibberish", "empty", "prompt_copy", "repetitive", "keyword_list"):
        assert re.search(rf"{kind}\s", result.output)
    data = json.loads(report.read_text())
    assert data["k"] == 2 and data["items"] == 1
    assert data["judges"][0]["request_failure_rate"] == 0.0
    assert 0.0 <= data["judges"][0]["parse_failure_rate"] <= 1.0
    assert [p["kind"] for p in data["planted"]] == [
        "gibberish", "empty", "prompt_copy", "repetitive", "keyword_list"
    ]  # fmt: skip
