"""The in-process judge backend, on the tiny random model (fast) and the embedded model (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpokit.errors import UserError
from grpokit.rewards.judge import JudgeParams, LocalJudge, build_judge_reward
from grpokit.rewards.judge.backends.local import LocalBackend
from tests.rewards.results import evaluate

RUBRIC = (
    "Rate the following business idea on a scale from 1 to 5. Answer with a single digit only."
    "\n\nIdea: {completion}\n\nRating (1-5):"
)


def test_local_backend_replies_with_consistent_logprobs(tiny_model_dir: Path) -> None:
    backend = LocalBackend(
        LocalJudge(backend="local", model=str(tiny_model_dir), max_tokens=6, batch_size=2),
        where="judges[0]",
    )
    try:
        prompts = ["Score: a", "Score this longer answer please: b", "Score: c"]
        replies = backend.complete(prompts, logprobs=True)
        again = backend.complete(prompts, logprobs=False)
    finally:
        backend.close()
    assert len(replies) == 3
    for reply, plain in zip(replies, again, strict=True):
        assert reply.error is None and reply.text is not None
        # Greedy: the same text with or without logprobs, whatever the batch padding.
        assert plain.text == reply.text
        if reply.tokens is None:  # decoding was not prefix-stable; scored without logprobs
            continue
        assert "".join(t.token for t in reply.tokens) == reply.text
        for token in reply.tokens:
            assert reply.text[token.offset : token.offset + len(token.token)] == token.token
            assert token.logprob <= 0.0
            assert len(token.top) == 20
            # Greedy decoding picks the most likely token.
            assert token.logprob >= max(lp for _, lp in token.top) - 1e-4


def test_local_judge_reward_never_crashes(tiny_model_dir: Path, tmp_path: Path) -> None:
    params = JudgeParams.model_validate(
        {
            "rubric": RUBRIC,
            "score_range": [1, 5],
            "mode": "expected",
            "judges": [{"backend": "local", "model": str(tiny_model_dir), "max_tokens": 4}],
        }
    )
    reward = build_judge_reward(params, tmp_path, tmp_path)
    try:
        result = evaluate(reward, ["topic"] * 3, ["idea one", "idea two", "idea one"])
        scores = result.values
        metrics = result.metrics
        assert len(scores) == 3
        assert all(s is None or 0.0 <= s <= 1.0 for s in scores)
        # A random model rarely writes a digit: failures are counted, never turned into 0.
        assert metrics["judge/request_failure_rate"] == 0.0
        failures = sum(s is None for s in scores) / 3
        assert metrics["judge/none_rate"] == pytest.approx(failures)
        assert scores[0] == scores[2]
        assert evaluate(reward, ["topic"], ["idea two"]).metrics["judge/cache_hit_rate"] == 1.0
    finally:
        reward.close()


def test_missing_local_model_is_a_user_error(tmp_path: Path) -> None:
    params = JudgeParams.model_validate(
        {"rubric": RUBRIC, "judges": [{"backend": "local", "model": str(tmp_path / "nope")}]}
    )
    with pytest.raises(UserError, match=r"judge\.judges\[0\]\.model"):
        build_judge_reward(params, tmp_path, tmp_path)


@pytest.mark.slow
def test_embedded_model_judges_with_scores(embedded_model_path: Path, tmp_path: Path) -> None:
    params = JudgeParams.model_validate(
        {
            "rubric": RUBRIC,
            "score_range": [1, 5],
            "mode": "expected",
            "cache": False,
            "judges": [{"backend": "local", "max_tokens": 8}],
        }
    )
    reward = build_judge_reward(params, tmp_path, tmp_path)
    try:
        ideas = [
            "A subscription service delivering healthy meals to busy office workers for 30 USD.",
            "An app.",
        ]
        result = evaluate(reward, ["topic"] * 2, ideas)
        scores = result.values
        assert result.metrics["judge/expected_fallback_rate"] == 0.0
    finally:
        reward.close()
    assert any(s is not None for s in scores)
    assert all(s is None or 0.0 <= s <= 1.0 for s in scores)
