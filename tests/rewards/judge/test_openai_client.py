"""The OpenAI-compatible judge client against a scripted local HTTP server (a stand-in for a
remote service): retries, back-off, timeouts, concurrency, keys, caching, ensembles."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from grpokit.errors import UserError
from grpokit.rewards import RewardResult
from grpokit.rewards.judge import JudgeParams, build_judge_reward
from grpokit.rewards.judge.reward import JudgeReward
from tests.rewards.results import evaluate, judged

from .conftest import Answer, FakeJudge, free_port

FakeFactory = Callable[..., FakeJudge]
RUBRIC = "Score this answer from 0 to 1.\nQuestion: {prompt}\nAnswer: {completion}"


def judge_params(*judges: dict[str, Any], **extra: Any) -> JudgeParams:
    return JudgeParams.model_validate({"rubric": RUBRIC, "judges": list(judges), **extra})


def openai(server: FakeJudge, **extra: Any) -> dict[str, Any]:
    """A judge on ``server``; without the start-up check unless asked, so that a test's
    scripted answers and request counts concern its own calls (test_startup.py tests it)."""
    return {
        "backend": "openai",
        "base_url": server.base_url,
        "model": "fake-judge",
        "backoff_s": 0.01,
        "check_at_start": False,
        **extra,
    }


def build(params: JudgeParams, tmp_path: Path) -> JudgeReward:
    return build_judge_reward(params, tmp_path, tmp_path / "run")


def test_retries_then_answers(fake_judge: FakeFactory, tmp_path: Path) -> None:
    def script(request: dict[str, Any], n: int) -> Answer:
        return Answer(status=503, content=None) if n < 2 else Answer(content="Score: 0.7")

    server = fake_judge(script)
    reward = build(judge_params(openai(server, max_retries=3), cache=False), tmp_path)
    try:
        result = evaluate(reward, ["q"], ["a"])
        assert result.values == [pytest.approx(0.7)]
    finally:
        reward.close()
    assert len(server.requests) == 3
    assert result.metrics["judge/request_failure_rate"] == 0.0
    request = server.requests[-1]
    assert request["model"] == "fake-judge"
    assert request["temperature"] == 0.0
    assert request["messages"] == [
        {"role": "user", "content": "Score this answer from 0 to 1.\nQuestion: q\nAnswer: a"}
    ]


def test_retries_exhausted_give_none_and_a_counted_failure(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    server = fake_judge(lambda request, n: Answer(status=500, content=None))
    reward = build(judge_params(openai(server, max_retries=2), cache=False), tmp_path)
    try:
        result = evaluate(reward, ["q", "q"], ["a", "b"])
        assert result.values == [None, None]
        assert result.metrics["judge/request_failure_rate"] == 1.0
        assert result.metrics["judge/none_rate"] == 1.0
        assert result.metrics["judge/parse_failure_rate"] == 0.0
        assert "HTTP 500" in (judged(result).outcomes[0][0].error or "")
    finally:
        reward.close()
    assert len(server.requests) == 2 * 3


def test_client_errors_are_not_retried(fake_judge: FakeFactory, tmp_path: Path) -> None:
    server = fake_judge(lambda request, n: Answer(status=404, content=None))
    reward = build(judge_params(openai(server, max_retries=3), cache=False), tmp_path)
    try:
        assert reward(["q"], ["a"]) == [None]
    finally:
        reward.close()
    assert len(server.requests) == 1


def test_retry_after_is_honoured(fake_judge: FakeFactory, tmp_path: Path) -> None:
    def script(request: dict[str, Any], n: int) -> Answer:
        if n == 0:
            return Answer(status=429, content=None, headers={"Retry-After": "0.6"})
        return Answer(content="0.3")

    server = fake_judge(script)
    reward = build(judge_params(openai(server), cache=False), tmp_path)
    try:
        started = time.perf_counter()
        assert reward(["q"], ["a"]) == [pytest.approx(0.3)]
        assert time.perf_counter() - started >= 0.55
    finally:
        reward.close()


def test_unparseable_reply_is_none_and_counted(fake_judge: FakeFactory, tmp_path: Path) -> None:
    def script(request: dict[str, Any], n: int) -> Answer:
        text = request["messages"][0]["content"]
        return Answer(content="I cannot judge this." if text.endswith("bad") else "0.9")

    server = fake_judge(script)
    reward = build(judge_params(openai(server), cache=False), tmp_path)
    try:
        result = evaluate(reward, ["q"] * 4, ["good", "bad", "good", "bad"])
        assert result.values == [
            pytest.approx(0.9), None, pytest.approx(0.9), None
        ]  # fmt: skip
        metrics = result.metrics
        assert metrics["judge/parse_failure_rate"] == 0.5
        assert metrics["judge/request_failure_rate"] == 0.0
        assert metrics["judge/none_rate"] == 0.5
        assert metrics["judge/0/mean"] == pytest.approx(0.9)
    finally:
        reward.close()
    # Two distinct judge prompts in the batch: each asked once.
    assert len(server.requests) == 2


def test_concurrency_is_bounded_and_parallel(fake_judge: FakeFactory, tmp_path: Path) -> None:
    server = fake_judge(lambda request, n: Answer(content="0.5", delay_s=0.3))
    reward = build(judge_params(openai(server, max_concurrency=3), cache=False), tmp_path)
    try:
        started = time.perf_counter()
        scores = reward(["q"] * 12, [f"answer {i}" for i in range(12)])
        elapsed = time.perf_counter() - started
    finally:
        reward.close()
    assert scores == [0.5] * 12
    assert server.max_in_flight == 3
    # 12 requests of 0.3 s, 3 at a time: 4 waves (1.2 s), below the 3.6 s of one at a time
    # (max_in_flight shows the parallelism; the bound leaves a loaded machine 2.4 s).
    assert 1.15 <= elapsed < 3.6


def test_batch_takes_about_the_slowest_request(fake_judge: FakeFactory, tmp_path: Path) -> None:
    server = fake_judge(lambda request, n: Answer(content="0.5", delay_s=0.4))
    reward = build(judge_params(openai(server, max_concurrency=16), cache=False), tmp_path)
    try:
        started = time.perf_counter()
        reward(["q"] * 8, [f"answer {i}" for i in range(8)])
        elapsed = time.perf_counter() - started
    finally:
        reward.close()
    assert server.max_in_flight == 8
    assert elapsed < 8 * 0.4  # not one after another (about 0.4 s; the rest for a loaded machine)


def test_two_threads_score_with_one_reward_and_get_their_own_results(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    # Nothing of a call is kept on the reward: each caller's metrics and outcomes are its own.
    def script(request: dict[str, Any], n: int) -> Answer:
        text = request["messages"][0]["content"]
        return Answer(content="I cannot judge this." if "bad" in text else "0.9", delay_s=0.2)

    server = fake_judge(script)
    reward = build(judge_params(openai(server), cache=False), tmp_path)
    together = threading.Barrier(2)

    def score(kind: str) -> RewardResult:
        together.wait()
        return evaluate(reward, ["q"] * 2, [f"{kind} one", f"{kind} two"])

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            good, bad = pool.map(score, ["good", "bad"])
    finally:
        reward.close()
    assert good.values == [pytest.approx(0.9)] * 2
    assert bad.values == [None, None]
    assert good.metrics["judge/parse_failure_rate"] == 0.0
    assert bad.metrics["judge/parse_failure_rate"] == 1.0
    assert [o.reply for o in judged(good).outcomes[0]] == ["0.9"] * 2
    assert judged(good).warning is None and judged(bad).warning is not None


def test_slow_server_hits_the_timeout(fake_judge: FakeFactory, tmp_path: Path) -> None:
    server = fake_judge(lambda request, n: Answer(content="0.5", delay_s=3.0))
    reward = build(
        judge_params(openai(server, timeout_s=0.3, max_retries=1), cache=False), tmp_path
    )
    try:
        started = time.perf_counter()
        result = evaluate(reward, ["q"], ["a"])
        assert result.values == [None]
        elapsed = time.perf_counter() - started
        assert "timeout after 0.3 s" in (judged(result).outcomes[0][0].error or "")
        assert result.metrics["judge/request_failure_rate"] == 1.0
    finally:
        reward.close()
    assert elapsed < 3.0  # both tries cut at 0.3 s (about 0.6 s), not the server's 3 s
    assert len(server.requests) == 2


def test_endpoint_without_logprobs_falls_back(fake_judge: FakeFactory, tmp_path: Path) -> None:
    def script(request: dict[str, Any], n: int) -> Answer:
        if request.get("logprobs"):
            return Answer(status=400, text='{"error": "logprobs are not supported"}')
        return Answer(content="0.4")

    server = fake_judge(script)
    params = judge_params(openai(server), mode="expected", cache=False)
    reward = build(params, tmp_path)
    try:
        result = evaluate(reward, ["q", "q"], ["a", "b"])
        assert result.values == [pytest.approx(0.4)] * 2
        assert result.metrics["judge/expected_fallback_rate"] == 1.0
        assert reward(["q"], ["c"]) == [pytest.approx(0.4)]
    finally:
        reward.close()
    # Once refused, later requests do not ask for logprobs again.
    assert not server.requests[-1].get("logprobs")


def test_api_key_comes_from_the_environment(
    fake_judge: FakeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = fake_judge(lambda request, n: Answer(content="1"))
    params = judge_params(openai(server, api_key_env="GRPOKIT_TEST_JUDGE_KEY"), cache=False)
    monkeypatch.delenv("GRPOKIT_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(UserError, match=r"judges\[0\]\.api_key_env.*GRPOKIT_TEST_JUDGE_KEY"):
        build(params, tmp_path)
    monkeypatch.setenv("GRPOKIT_TEST_JUDGE_KEY", "sk-test-123")
    reward = build(params, tmp_path)
    try:
        assert reward(["q"], ["a"]) == [1.0]
    finally:
        reward.close()
    assert server.headers[-1]["Authorization"] == "Bearer sk-test-123"


def test_rejected_key_at_start_is_a_user_error(fake_judge: FakeFactory, tmp_path: Path) -> None:
    server = fake_judge(lambda request, n: Answer(), models_status=401)
    with pytest.raises(UserError, match="HTTP 401"):
        build(judge_params(openai(server, check_at_start=True)), tmp_path)


def test_unreachable_url_at_start_is_a_user_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    params = judge_params({"backend": "openai", "base_url": url, "model": "m"})
    with pytest.raises(UserError, match=rf"judges\[0\]\.base_url: .*{url} is unreachable"):
        build(params, tmp_path)


def test_cache_answers_repeats_and_survives_restart(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    server = fake_judge(lambda request, n: Answer(content="0.6"))
    params = judge_params(openai(server))
    reward = build(params, tmp_path)
    try:
        result = evaluate(reward, ["q", "q"], ["a", "b"])
        assert result.values == [pytest.approx(0.6)] * 2
        assert result.metrics["judge/cache_hit_rate"] == 0.0
        result = evaluate(reward, ["q", "q"], ["a", "c"])
        assert result.values == [pytest.approx(0.6)] * 2
        assert result.metrics["judge/cache_hit_rate"] == 0.5
    finally:
        reward.close()
    assert len(server.requests) == 3
    assert (tmp_path / "run" / "judge_cache.sqlite").is_file()
    # A new process (new reward object) on the same run directory: no request at all.
    again = build(params, tmp_path)
    try:
        result = evaluate(again, ["q", "q", "q"], ["a", "b", "c"])
        assert result.values == [pytest.approx(0.6)] * 3
        assert result.metrics["judge/cache_hit_rate"] == 1.0
    finally:
        again.close()
    assert len(server.requests) == 3
    # Another rubric is another key.
    other = build(params.model_copy(update={"rubric": "Strictly: {completion}"}), tmp_path)
    try:
        other(["q"], ["a"])
    finally:
        other.close()
    assert len(server.requests) == 4


def test_failures_are_not_cached(fake_judge: FakeFactory, tmp_path: Path) -> None:
    def script(request: dict[str, Any], n: int) -> Answer:
        return Answer(status=503, content=None) if n == 0 else Answer(content="0.2")

    server = fake_judge(script)
    reward = build(judge_params(openai(server, max_retries=0)), tmp_path)
    try:
        assert reward(["q"], ["a"]) == [None]
        assert reward(["q"], ["a"]) == [pytest.approx(0.2)]
    finally:
        reward.close()


def test_ensemble_aggregates_and_reports_disagreement(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    low = fake_judge(lambda request, n: Answer(content="0.2"))
    high = fake_judge(lambda request, n: Answer(content="0.8"))
    broken = fake_judge(lambda request, n: Answer(content="no idea"))
    judges = [openai(low, name="low"), openai(high, name="high"), openai(broken, name="broken")]
    reward = build(judge_params(*judges, cache=False), tmp_path)
    try:
        result = evaluate(reward, ["q"], ["a"])
        assert result.values == [pytest.approx(0.5)]
        metrics = result.metrics
        assert metrics["judge/low/mean"] == pytest.approx(0.2)
        assert metrics["judge/high/mean"] == pytest.approx(0.8)
        assert metrics["judge/disagreement"] == pytest.approx(0.3)
        assert metrics["judge/parse_failure_rate"] == pytest.approx(1 / 3)
        assert metrics["judge/none_rate"] == 0.0
    finally:
        reward.close()
    median = build(
        judge_params(openai(low), openai(high), openai(high), aggregate="median", cache=False),
        tmp_path,
    )
    try:
        assert median(["q"], ["a"]) == [pytest.approx(0.8)]
    finally:
        median.close()


def test_rubric_phrasings_per_judge(fake_judge: FakeFactory, tmp_path: Path) -> None:
    server = fake_judge(lambda request, n: Answer(content="4"))
    judges = [
        openai(server, rubric="Score 1-5: {completion}", score_range=[1, 5]),
        openai(server, rubric="Score 0-10: {completion}", score_range=[0, 10]),
    ]
    reward = build(judge_params(*judges, cache=False), tmp_path)
    try:
        assert reward(["q"], ["a"]) == [pytest.approx((0.75 + 0.4) / 2)]
    finally:
        reward.close()
    assert {r["messages"][0]["content"] for r in server.requests} == {
        "Score 1-5: a",
        "Score 0-10: a",
    }


def test_registered_and_built_through_the_registry(fake_judge: FakeFactory, tmp_path: Path) -> None:
    from grpokit.rewards.registry import BuildContext, get_reward_type

    server = fake_judge(lambda request, n: Answer(content="0.5"))
    reward_type = get_reward_type("judge")
    params = reward_type.params_model.model_validate({"rubric": RUBRIC, "judges": [openai(server)]})
    fn = reward_type.build(params, BuildContext(base_dir=tmp_path, run_dir=tmp_path / "r", seed=0))
    try:
        result = evaluate(fn, ["q"], [[{"role": "assistant", "content": "a"}]])  # type: ignore[arg-type]
        assert result.values == [0.5]
        assert result.metrics["judge/0/mean"] == 0.5
    finally:
        fn.close()  # type: ignore[attr-defined]
    assert reward_type.max_value == 1.0
    assert (tmp_path / "r" / "judge_cache.sqlite").is_file()


def test_gate_keeps_failing_completions_away_from_the_judge(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    from grpokit.rewards.compose import build_reward_set
    from grpokit.rewards.registry import BuildContext
    from grpokit.rewards.spec import RewardSpec

    server = fake_judge(lambda request, n: Answer(content="0.9"))
    specs = [
        RewardSpec.model_validate({"type": "xml_format", "tags": ["thinking", "proposal"]}),
        RewardSpec.model_validate(
            {
                "type": "judge",
                "name": "quality",
                "gate": {"reward": "xml_format", "min": 1.0},
                "rubric": "{completion}",
                "judges": [openai(server)],
                "cache": False,
            }
        ),
    ]
    good = "<thinking>\nx\n</thinking>\n<proposal>\ny\n</proposal>"
    with build_reward_set(specs, BuildContext(base_dir=tmp_path)) as rewards:
        scores = rewards(["q", "q"], [good, "no tags"], {})
    assert scores.column("quality") == [pytest.approx(0.9), 0.0]
    assert len(server.requests) == 1
