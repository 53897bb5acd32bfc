"""Request fields against servers that refuse some of them, as OpenAI's reasoning models do.

The server is a local HTTP server answering the way OpenAI does (a stand-in for the outside
world); the judge client, its retries and what it remembers are real.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from grpokit.rewards.judge import JudgeParams, OpenAIJudge, build_judge_reward
from grpokit.rewards.judge.backends.openai import refused_field
from tests.rewards.results import evaluate, judged

from .conftest import Answer, FakeJudge

FakeFactory = Callable[..., FakeJudge]
RUBRIC = "Score this answer from 0 to 1.\nQuestion: {prompt}\nAnswer: {completion}"
OPENAI_LOGGER = "grpokit.rewards.judge.backends.openai"


def openai_error(message: str, param: str, code: str) -> Answer:
    """An HTTP 400 with OpenAI's error body."""
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return Answer(status=400, text=json.dumps({"error": error}))


MAX_TOKENS_REFUSED = openai_error(
    "Unsupported parameter: 'max_tokens' is not supported with this model. "
    "Use 'max_completion_tokens' instead.",
    "max_tokens",
    "unsupported_parameter",
)
TEMPERATURE_REFUSED = openai_error(
    "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) "
    "value is supported.",
    "temperature",
    "unsupported_value",
)


def reasoning_model(request: dict[str, Any], n: int) -> Answer:
    """What OpenAI's reasoning models accept: max_completion_tokens, default temperature."""
    if "max_tokens" in request:
        return MAX_TOKENS_REFUSED
    if request.get("temperature", 1) != 1:
        return TEMPERATURE_REFUSED
    return Answer(content="Score: 0.8")


def params(server: FakeJudge, **judge: Any) -> JudgeParams:
    spec = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": "fake-judge",
        "backoff_s": 0.01,
        **judge,
    }
    return JudgeParams.model_validate({"rubric": RUBRIC, "judges": [spec], "cache": False})


def test_refused_field_reads_openai_errors() -> None:
    assert refused_field(MAX_TOKENS_REFUSED.text or "") == "max_tokens"
    assert refused_field(TEMPERATURE_REFUSED.text or "") == "temperature"
    # A server copying only the wording, or with another error shape.
    assert (
        refused_field("Unsupported parameter: 'max_tokens' ... use 'max_completion_tokens'")
        == "max_tokens"
    )
    assert refused_field('{"error": "temperature is not supported for this model"}') == (
        "temperature"
    )
    # Other errors are not refusals of a field the client can drop.
    context = openai_error("This model's maximum context length is 8192 tokens.", "messages", "x")
    assert refused_field(context.text or "") is None
    assert refused_field('{"error": {"message": "max_completion_tokens must be > 0"}}') is None
    assert refused_field("<html>Bad Request</html>") is None


def test_reasoning_model_negotiated_once_and_remembered(
    fake_judge: FakeFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = fake_judge(reasoning_model)
    caplog.set_level(logging.WARNING, logger=OPENAI_LOGGER)
    reward = build_judge_reward(params(server, max_concurrency=4), tmp_path, None)
    try:
        # The start-up request met both refusals: max_tokens, then temperature, then answered.
        startup = server.requests[:3]
        assert "max_tokens" in startup[0] and "temperature" in startup[0]
        assert "max_completion_tokens" in startup[1] and "max_tokens" not in startup[1]
        assert "temperature" not in startup[2] and startup[2]["max_completion_tokens"] == 32
        # Training calls go out corrected from the first request on.
        before = len(server.requests)
        result = evaluate(reward, ["q"] * 6, [f"answer {i}" for i in range(6)])
        assert result.values == [pytest.approx(0.8)] * 6
        assert len(server.requests) == before + 6
        for request in server.requests[before:]:
            assert "max_tokens" not in request and "temperature" not in request
            assert request["max_completion_tokens"] == 32
        assert result.metrics["judge/request_failure_rate"] == 0.0
    finally:
        reward.close()
    logged = [r.getMessage() for r in caplog.records if r.name == OPENAI_LOGGER]
    assert len(logged) == 2  # each switch logged once
    assert "sent as max_completion_tokens from now on" in logged[0]
    assert "refuses temperature 0" in logged[1]


def test_concurrent_refusals_switch_once(
    fake_judge: FakeFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # No start-up check: a whole batch of requests meets the refusal at the same time.
    server = fake_judge(reasoning_model)
    caplog.set_level(logging.WARNING, logger=OPENAI_LOGGER)
    reward = build_judge_reward(
        params(server, check_at_start=False, temperature=1.0, max_concurrency=8), tmp_path, None
    )
    try:
        result = evaluate(reward, ["q"] * 8, [f"answer {i}" for i in range(8)])
        scores = result.values
        assert scores == [pytest.approx(0.8)] * 8
        assert result.metrics["judge/request_failure_rate"] == 0.0
    finally:
        reward.close()
    # Each request was refused at most once, then sent again corrected.
    refused = [r for r in server.requests if "max_tokens" in r]
    assert 1 <= len(refused) <= 8 and len(server.requests) == len(refused) + 8
    logged = [r.getMessage() for r in caplog.records if r.name == OPENAI_LOGGER]
    assert len(logged) == 1 and "max_completion_tokens" in logged[0]


def test_a_refusal_after_the_switch_is_a_failure_not_a_loop(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    # A server that refuses max_tokens and then max_completion_tokens too (with the same text).
    server = fake_judge(lambda request, n: MAX_TOKENS_REFUSED)
    reward = build_judge_reward(params(server, check_at_start=False), tmp_path, None)
    try:
        result = evaluate(reward, ["q"], ["a"])
        assert result.values == [None]
        assert "HTTP 400" in (judged(result).outcomes[0][0].error or "")
    finally:
        reward.close()
    assert len(server.requests) == 2


def test_configured_max_completion_tokens_and_extra_body(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    server = fake_judge(reasoning_model)
    extra = {"reasoning_effort": "low", "metadata": {"run": "test"}}
    reward = build_judge_reward(
        params(server, max_completion_tokens=2000, temperature=1.0, extra_body=extra),
        tmp_path,
        None,
    )
    try:
        assert reward(["q"], ["a"]) == [pytest.approx(0.8)]
    finally:
        reward.close()
    # Never refused: the start-up request and the call both went out as configured.
    assert len(server.requests) == 2
    for request in server.requests:
        assert request["max_completion_tokens"] == 2000 and "max_tokens" not in request
        assert request["reasoning_effort"] == "low" and request["metadata"] == {"run": "test"}
        assert request["model"] == "fake-judge" and request["temperature"] == 1.0


def test_extra_body_is_part_of_the_cache_key(fake_judge: FakeFactory, tmp_path: Path) -> None:
    server = fake_judge(lambda request, n: Answer(content="0.5"))
    plain = params(server, check_at_start=False).model_copy(update={"cache": True})
    seeded = plain.model_copy(
        update={"judges": [plain.judges[0].model_copy(update={"extra_body": {"seed": 1}})]}
    )
    for config in (plain, plain, seeded):
        reward = build_judge_reward(config, tmp_path, tmp_path)
        try:
            assert reward(["q"], ["a"]) == [0.5]
        finally:
            reward.close()
    # The repeat of plain came from the cache; seeded is another judge setting.
    assert len(server.requests) == 2
    assert "seed" not in server.requests[0] and server.requests[1]["seed"] == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"extra_body": {"temperature": 1}}, "extra_body sets temperature, which grpokit sets"),
        ({"extra_body": {"messages": [], "stream": True}}, "extra_body sets messages, stream"),
        ({"max_tokens": 64, "max_completion_tokens": 64}, "either max_tokens or max_completion"),
    ],
)
def test_conflicting_fields_are_config_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        OpenAIJudge.model_validate(
            {"backend": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m", **fields}
        )
