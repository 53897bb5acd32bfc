"""The start-up check (one real scoring request on a fixed sample) and the parse-failure warning,
against a local HTTP server standing in for the judge's endpoint; the client is real."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.errors import UserError
from grpokit.rewards.judge import JudgeParams, build_judge_reward
from grpokit.rewards.judge.reward import START_COMPLETION, START_PROMPT
from tests.rewards.results import evaluate, judged

from .conftest import Answer, FakeJudge

FakeFactory = Callable[..., FakeJudge]
RUBRIC = "Score 0-1 against the reference {answer}.\nQuestion: {prompt}\nAnswer: {completion}"
REWARD_LOGGER = "grpokit.rewards.judge.reward"


def params(server: FakeJudge, **extra: Any) -> JudgeParams:
    judge = {"backend": "openai", "base_url": server.base_url, "model": "fake-judge"}
    return JudgeParams.model_validate(
        {"rubric": RUBRIC, "judges": [{**judge, "backoff_s": 0.01}], "cache": False, **extra}
    )


def test_startup_scores_the_fixed_sample(fake_judge: FakeFactory, tmp_path: Path) -> None:
    server = fake_judge(lambda request, n: Answer(content="1"))
    reward = build_judge_reward(params(server), tmp_path, None)
    reward.close()
    assert len(server.requests) == 1
    text = server.requests[0]["messages"][0]["content"]
    # The rubric's dataset column gets the sample's reference answer.
    assert text == (
        f"Score 0-1 against the reference Paris.\nQuestion: {START_PROMPT}\n"
        f"Answer: {START_COMPLETION}"
    )


def test_startup_request_refused_names_judge_url_model_and_answer(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    error = {"error": {"message": "The model `fake-judge` does not exist", "code": "not_found"}}
    server = fake_judge(lambda request, n: Answer(status=404, text=json.dumps(error)))
    with pytest.raises(UserError) as info:
        build_judge_reward(params(server), tmp_path, None, where="reward 'quality'")
    message = str(info.value)
    assert message.startswith("reward 'quality'.judges[0] (judge 0: openai fake-judge @ ")
    assert server.base_url in message
    assert "start-up scoring request failed: HTTP 404" in message
    assert "The model `fake-judge` does not exist" in message
    assert "check_at_start: false" in message


def test_startup_reply_without_a_score_is_a_user_error(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    server = fake_judge(lambda request, n: Answer(content="I'd rather not say."))
    with pytest.raises(UserError, match=r"holds no score on the 0-1 scale: \"I'd rather not say"):
        build_judge_reward(params(server), tmp_path, None)
    # An empty reply (a reasoning model that spent its limit) points at the limit.
    empty = fake_judge(lambda request, n: Answer(content=""))
    with pytest.raises(UserError, match="max_completion_tokens in the thousands"):
        build_judge_reward(params(empty), tmp_path, None)
    # The check can be switched off; then nothing is sent until the first call.
    off = params(server).model_copy(
        update={"judges": [params(server).judges[0].model_copy(update={"check_at_start": False})]}
    )
    before = len(server.requests)
    build_judge_reward(off, tmp_path, None).close()
    assert len(server.requests) == before


def test_parse_failure_warning_once_per_stretch(
    fake_judge: FakeFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def script(request: dict[str, Any], n: int) -> Answer:
        text = request["messages"][0]["content"]
        return Answer(content="Hmm, hard to say." if "vague" in text else "0.7")

    server = fake_judge(script)
    caplog.set_level(logging.WARNING, logger=REWARD_LOGGER)
    reward = build_judge_reward(params(server, max_parse_failure_rate=0.25), tmp_path, None)
    answers = {"answer": ["x"] * 4}
    try:
        # 1 of 4 unparsable: at the limit, no warning.
        result = evaluate(reward, ["q"] * 4, ["vague", "a", "b", "c"], **answers)
        assert judged(result).warning is None
        # 2 of 4: over it, warned with the share and an example reply.
        result = evaluate(reward, ["q"] * 4, ["vague 1", "vague 2", "d", "e"], **answers)
        warning = judged(result).warning or ""
        assert "2 of 4 judge replies (50%) held no score on the 0-1 scale" in warning
        assert "max_parse_failure_rate: 0.25" in warning
        assert "'Hmm, hard to say.'" in warning
        assert result.metrics["judge/parse_failure_rate"] == 0.5
        # Still over: the metric says so at every step; the log only once per stretch.
        reward(["q"] * 2, ["vague 3", "f"], answer=["x"] * 2)
        reward(["q"], ["g"], answer=["x"])  # back under
        reward(["q"], ["vague 4"], answer=["x"])  # over again: logged again
    finally:
        reward.close()
    logged = [r.getMessage() for r in caplog.records if r.name == REWARD_LOGGER]
    assert len(logged) == 2
    assert logged[0].startswith("judge: 2 of 4 judge replies")
    assert logged[1].startswith("judge: 1 of 1 judge replies (100%)")


def test_rewards_check_prints_the_parse_warning(fake_judge: FakeFactory, tmp_path: Path) -> None:
    def script(request: dict[str, Any], n: int) -> Answer:
        text = request["messages"][0]["content"]
        return Answer(content="1" if START_COMPLETION in text else "Looks fine to me!")

    server = fake_judge(script)
    config = tmp_path / "config.yaml"
    judge = {"backend": "openai", "base_url": server.base_url, "model": "fake-judge"}
    rewards = [
        {
            "type": "judge",
            "name": "quality",
            "rubric": "{completion}",
            "judges": [judge],
            "cache": False,
        }
    ]
    config.write_text(json.dumps({"rewards": rewards}), encoding="utf-8")
    completions = tmp_path / "samples.jsonl"
    completions.write_text(
        "".join(json.dumps({"completion": f"answer {i}"}) + "\n" for i in range(3)),
        encoding="utf-8",
    )
    result = CliRunner().invoke(
        main, ["rewards", "check", str(config), "--completions", str(completions), "--json"]
    )
    assert result.exit_code == 0, result.output
    # stdout: one JSON object per completion; the warning on stderr.
    assert [json.loads(line)["rewards"]["quality"] for line in result.stdout.splitlines()] == [
        None
    ] * 3
    assert "warning: judge: 3 of 3 judge replies (100%) held no score" in result.stderr
    assert "'Looks fine to me!'" in result.stderr
