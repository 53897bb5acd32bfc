"""The judge client at API scale, against a scripted local server: requests and tokens per
minute measured by the server's request timestamps, HTTP 429 with Retry-After (seconds or an HTTP
date) holding back the endpoint, and the tokens and money each call used as metrics."""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grpokit.rewards.judge import JudgeParams, build_judge_reward
from grpokit.rewards.judge.backends.openai import retry_after_seconds
from grpokit.rewards.judge.reward import JudgeReward
from tests.rewards.results import evaluate

from .conftest import Answer, FakeJudge

FakeFactory = Callable[..., FakeJudge]
RUBRIC = "Score 0-1: {completion}"


class Clocked:
    """A script wrapper recording when each request reached the server."""

    def __init__(self, script: Callable[[dict[str, Any], int], Answer]) -> None:
        self.script = script
        self.times: dict[int, float] = {}
        self._lock = threading.Lock()

    def __call__(self, request: dict[str, Any], n: int) -> Answer:
        with self._lock:
            self.times[n] = time.monotonic()
        return self.script(request, n)

    def starts(self) -> list[float]:
        return [self.times[n] for n in sorted(self.times)]


def judge_reward(server: FakeJudge, tmp_path: Path, **judge: Any) -> JudgeReward:
    spec = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": "fake-judge",
        "backoff_s": 0.01,
        "check_at_start": False,
        "max_tokens": 1,
        **judge,
    }
    params = JudgeParams.model_validate({"rubric": RUBRIC, "judges": [spec], "cache": False})
    return build_judge_reward(params, tmp_path, tmp_path)


def usage_answer(prompt_tokens: int, completion_tokens: int) -> Answer:
    return Answer(
        body={
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "0.5"}}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


def test_requests_per_minute_spaces_request_starts(fake_judge: FakeFactory, tmp_path: Path) -> None:
    clocked = Clocked(lambda request, n: Answer(content="0.5"))
    server = fake_judge(clocked)
    reward = judge_reward(server, tmp_path, max_requests_per_minute=120, max_concurrency=8)
    try:
        started = time.monotonic()
        assert reward(["q"] * 5, [f"answer {i}" for i in range(5)]) == [pytest.approx(0.5)] * 5
        elapsed = time.monotonic() - started
    finally:
        reward.close()
    starts = clocked.starts()
    assert len(starts) == 5
    # 120 a minute: one every 0.5 s, although 8 could be in flight at once (unlimited, all five
    # arrive within a few milliseconds). Arrival times at the server carry the scheduling
    # jitter of a loaded machine: any k requests span at least (k - 1) x 0.5 s, less 0.4 s.
    for i in range(5):
        for j in range(i + 1, 5):
            assert starts[j] - starts[i] >= (j - i) * 0.5 - 0.4, starts
    assert starts[-1] - starts[0] >= 1.6
    assert 1.9 <= elapsed < 5.0


def test_tokens_per_minute_waits_for_the_usage_the_server_reported(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    clocked = Clocked(lambda request, n: usage_answer(250, 50))
    server = fake_judge(clocked)
    # 600 a minute = 10 a second; each request books 14 before it starts (12 prompt bytes / 4,
    # plus 1, plus the 10-token reply limit) and the server then says it used 300: two fit the
    # first minute's bucket, the third waits for 14 tokens to come back (1.4 s). Without the
    # correction by usage, all three would fit at once.
    reward = judge_reward(
        server, tmp_path, max_tokens_per_minute=600, max_concurrency=1, max_tokens=10
    )
    try:
        reward(["q"] * 3, ["a", "b", "c"])
    finally:
        reward.close()
    t0, t1, t2 = clocked.starts()
    assert t1 - t0 < 0.6
    assert 1.0 <= t2 - t1 < 3.0, (t1 - t0, t2 - t1)


def test_429_retry_after_seconds_holds_back_the_endpoint(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    def script(request: dict[str, Any], n: int) -> Answer:
        if n == 0:
            return Answer(status=429, content=None, headers={"Retry-After": "1"})
        return Answer(content="0.25")

    clocked = Clocked(script)
    server = fake_judge(clocked)
    reward = judge_reward(server, tmp_path, max_concurrency=1)
    try:
        result = evaluate(reward, ["q", "q"], ["a", "b"])
        assert result.values == [pytest.approx(0.25)] * 2
        assert result.metrics["judge/request_failure_rate"] == 0.0
    finally:
        reward.close()
    starts = clocked.starts()
    assert len(starts) == 3
    # Nothing reached the server in the second after the 429, neither the retry nor the other
    # prompt.
    assert starts[1] - starts[0] >= 0.95


def test_429_retry_after_http_date(fake_judge: FakeFactory, tmp_path: Path) -> None:
    def script(request: dict[str, Any], n: int) -> Answer:
        if n == 0:
            when = email.utils.formatdate(time.time() + 2, usegmt=True)
            return Answer(status=429, content=None, headers={"Retry-After": when})
        return Answer(content="0.75")

    clocked = Clocked(script)
    server = fake_judge(clocked)
    reward = judge_reward(server, tmp_path)
    try:
        assert reward(["q"], ["a"]) == [pytest.approx(0.75)]
    finally:
        reward.close()
    t0, t1 = clocked.starts()
    # The date has whole seconds: 2 s ahead, less what the truncation takes (under 1 s).
    assert 0.95 <= t1 - t0 < 3.5


def test_retry_after_values() -> None:
    assert retry_after_seconds("3", 100.0) == 3.0
    assert retry_after_seconds("-4", 100.0) == 0.0
    assert retry_after_seconds("Thu, 01 Jan 1970 00:01:40 GMT", 90.0) == 10.0
    assert retry_after_seconds("Thu, 01 Jan 1970 00:01:40 GMT", 200.0) == 0.0  # in the past
    assert retry_after_seconds("99999", 0.0) == 300.0  # capped
    assert retry_after_seconds("soon", 0.0) is None
    assert retry_after_seconds("nan", 0.0) is None


def test_tokens_and_cost_per_call_are_metrics(fake_judge: FakeFactory, tmp_path: Path) -> None:
    server = fake_judge(lambda request, n: usage_answer(1000, 200))
    spec = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": "fake-judge",
        "name": "api",
        "check_at_start": False,
        "price_per_million_input_tokens": 2.0,
        "price_per_million_output_tokens": 10.0,
    }
    params = JudgeParams.model_validate({"rubric": RUBRIC, "judges": [spec]})
    reward = build_judge_reward(params, tmp_path, tmp_path)
    try:
        first = evaluate(reward, ["q", "q"], ["a", "b"]).metrics
        # From the cache: no tokens, no money.
        second = evaluate(reward, ["q", "q"], ["a", "b"]).metrics
    finally:
        reward.close()
    assert first["judge/api/tokens_in"] == first["judge/tokens_in"] == 2000
    assert first["judge/api/tokens_out"] == first["judge/tokens_out"] == 400
    assert (
        first["judge/api/cost"]
        == first["judge/cost"]
        == pytest.approx((2000 * 2.0 + 400 * 10.0) / 1e6)
    )
    assert second["judge/tokens_in"] == second["judge/tokens_out"] == second["judge/cost"] == 0.0
