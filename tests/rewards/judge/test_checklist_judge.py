"""The checklist's yes/no judge items: the probability of yes read from token log-probs (exact
arithmetic against a scripted endpoint), the parsed yes/no without them, the start-up check for a
judge that returns no log-probs, and the real llama.cpp server."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grpokit.errors import UserError
from grpokit.rewards import BuildContext, build_reward_set
from grpokit.rewards.judge import JudgeParams, build_judge_reward
from grpokit.rewards.judge.expected import TokenLogprob
from grpokit.rewards.judge.yes_no import parse_yes_no, token_answer, yes_probability
from grpokit.rewards.spec import parse_reward_specs

from .conftest import LLAMA_MODEL_ALIAS, Answer, FakeJudge, LlamaServer

FakeFactory = Callable[..., FakeJudge]
QUESTION = (
    "Topic: {prompt}\nProposal: {completion}\n"
    "Does the proposal state a price or fee? Answer yes or no."
)


def logprob_body(content: str, first: str, top: dict[str, float]) -> dict[str, Any]:
    """A chat completion whose reply is ``content``: its first token ``first`` with the given
    alternatives (probabilities), the rest of the text one more token at probability 1."""
    entries = [
        {
            "token": first,
            "logprob": math.log(top[first]),
            "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in top.items()],
        }
    ]
    if content[len(first) :]:
        entries.append({"token": content[len(first) :], "logprob": 0.0, "top_logprobs": []})
    return {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": {"content": entries},
            }
        ]
    }


def checklist(server: FakeJudge, **extra: Any) -> list[dict[str, Any]]:
    judge = {"backend": "openai", "base_url": server.base_url, "model": "fake-judge"}
    return [
        {
            "type": "checklist",
            "items": [
                {"name": "price", "question": QUESTION, "weight": 3.0},
                {"name": "short", "max_chars": 20},
            ],
            "judges": [{**judge, "backoff_s": 0.01}],
            "cache": False,
            **extra,
        }
    ]


def test_yes_probability_arithmetic() -> None:
    tokens = [
        TokenLogprob(0, "Yes", math.log(0.6), (("Yes", math.log(0.6)), ("No", math.log(0.2)),
                                              (" yes", math.log(0.1)), ("Maybe", math.log(0.05)))),
    ]  # fmt: skip
    assert yes_probability("Yes", tokens) == pytest.approx(0.7 / 0.9)
    # The answer word after other text: the distribution at its own token is read.
    reply = "Answer: no"
    tokens = [
        TokenLogprob(0, "Answer", 0.0, ()),
        TokenLogprob(6, ":", 0.0, ()),
        TokenLogprob(7, " no", math.log(0.5), ((" no", math.log(0.5)), (" yes", math.log(0.25)))),
    ]
    assert yes_probability(reply, tokens) == pytest.approx(0.25 / 0.75)
    assert yes_probability("I cannot tell", []) is None
    assert yes_probability("はい", []) == 1.0  # no token covers it: the written answer
    assert parse_yes_no("No, there is no price.") == 0.0
    assert parse_yes_no("いいえ") == 0.0
    assert parse_yes_no("Nothing known") is None
    assert [token_answer(t) for t in ("YES", " n", "いい", "は", "Not", "")] == [
        True, False, False, True, None, None,
    ]  # fmt: skip


def test_question_items_score_the_probability_of_yes(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    server = fake_judge(
        lambda request, n: Answer(
            body=logprob_body("Yes.", "Yes", {"Yes": 0.6, "No": 0.3, "Maybe": 0.1})
        )
    )
    specs = parse_reward_specs(checklist(server))
    with build_reward_set(specs, BuildContext(base_dir=tmp_path)) as rewards:
        assert len(server.requests) == 1  # the start-up check asked the question once
        scores = rewards(["Nurses x IoT", "Nurses x IoT"], ["A tracker, 5 USD.", "x" * 30], {})
    p_yes = 0.6 / 0.9
    assert scores.parts["checklist/price"].tolist() == pytest.approx([p_yes, p_yes])
    assert scores.parts["checklist/short"].tolist() == [1.0, 0.0]
    assert scores.column("checklist") == pytest.approx([(3 * p_yes + 1) / 4, 3 * p_yes / 4])
    assert scores.metrics["checklist/price/pass_rate"] == pytest.approx(p_yes)
    assert scores.metrics["judge/price/expected_fallback_rate"] == 0.0
    asked = server.requests[1:]
    assert all(request["logprobs"] is True for request in asked)
    assert sorted(r["messages"][0]["content"] for r in asked) == [
        f"Topic: Nurses x IoT\nProposal: {text}\n"
        "Does the proposal state a price or fee? Answer yes or no."
        for text in ("A tracker, 5 USD.", "x" * 30)
    ]


def test_a_judge_without_logprobs_is_stopped_at_start_unless_accepted(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    server = fake_judge(
        lambda request, n: Answer(content="Yes" if "USD" in str(request) else "No, none.")
    )
    with pytest.raises(UserError, match="came without them.*require_logprobs: false"):
        build_reward_set(parse_reward_specs(checklist(server)), BuildContext(base_dir=tmp_path))
    specs = parse_reward_specs(checklist(server, require_logprobs=False))
    with build_reward_set(specs, BuildContext(base_dir=tmp_path)) as rewards:
        scores = rewards(["t", "t"], ["A tracker, 5 USD.", "A tracker."], {})
    assert scores.parts["checklist/price"].tolist() == [1.0, 0.0]
    assert scores.metrics["judge/price/expected_fallback_rate"] == 1.0

    # The judge reward's expected mode has the same start-up check.
    numbers = fake_judge(lambda request, n: Answer(content="0.5"))
    judge = {"backend": "openai", "base_url": numbers.base_url, "model": "fake-judge"}
    params = JudgeParams.model_validate(
        {"rubric": "Score 0-1: {completion}", "mode": "expected", "judges": [judge]}
    )
    with pytest.raises(UserError, match="`mode: expected` reads the judge's token log-prob"):
        build_judge_reward(params, tmp_path, None)


def test_a_question_the_judge_cannot_answer_yes_or_no_stops_the_start(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    server = fake_judge(lambda request, n: Answer(content="It depends."))
    with pytest.raises(UserError, match=r"items\[0\] \(price\).*holds no yes or no"):
        build_reward_set(parse_reward_specs(checklist(server)), BuildContext(base_dir=tmp_path))


def test_question_items_on_the_real_llama_server(llama_server: LlamaServer, tmp_path: Path) -> None:
    judge = {
        "backend": "openai",
        "base_url": llama_server.base_url,
        "model": LLAMA_MODEL_ALIAS,
        "max_tokens": 4,
    }
    items = [
        {"name": "price", "question": "Text: {completion}\nDoes the text state a price? "
                                      "Answer yes or no.\nAnswer:"},
        {"name": "customer", "question": "Text: {completion}\nDoes the text name a customer? "
                                         "Answer yes or no.\nAnswer:"},
    ]  # fmt: skip
    raw = [{"type": "checklist", "items": items, "judges": [judge]}]
    completions = [
        "A meal subscription for busy nurses at 30 USD a week.",
        "Something with computers.",
    ]
    specs = parse_reward_specs(raw)
    with build_reward_set(specs, BuildContext(base_dir=tmp_path, run_dir=tmp_path)) as rewards:
        scores = rewards(["topic", "topic"], completions, {})
        again = rewards(["topic", "topic"], completions, {})
    for name in ("price", "customer"):
        values = scores.parts[f"checklist/{name}"].tolist()
        # The server returned log-probs and they were used: probabilities, not the written 0/1.
        assert scores.metrics[f"judge/{name}/request_failure_rate"] == 0.0
        assert scores.metrics[f"judge/{name}/expected_fallback_rate"] == 0.0
        present = [v for v in values if not math.isnan(v)]
        assert present and all(0.0 <= v <= 1.0 for v in present)
        assert any(0.0 < v < 1.0 for v in present)
        assert 0.0 <= scores.metrics[f"checklist/{name}/pass_rate"] <= 1.0
        # llama.cpp reports usage: what each question cost, in tokens.
        assert scores.metrics[f"judge/{name}/tokens_in"] > 0
        assert scores.metrics[f"judge/{name}/tokens_out"] > 0
    assert scores.metrics["judge/tokens_in"] == sum(
        scores.metrics[f"judge/{name}/tokens_in"] for name in ("price", "customer")
    )
    assert again.metrics["judge/tokens_in"] == 0.0
    # The second call is answered from the cache with the same numbers.
    assert again.metrics["judge/price/cache_hit_rate"] == 1.0
    assert again.parts["checklist/price"].tolist() == pytest.approx(
        scores.parts["checklist/price"].tolist(), nan_ok=True
    )


def test_questions_are_asked_completion_by_completion(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    """Every question about one completion is asked before the next completion's, so that a
    one-slot server's prompt cache serves the later ones; a question gated on another item is
    asked in its turn, after the item it waits for; the scores do not change with the order."""
    server = fake_judge(
        lambda request, n: Answer(
            body={
                **logprob_body("Yes", "Yes", {"Yes": 0.6, "No": 0.3}),
                "usage": {
                    "prompt_tokens": 40,
                    "completion_tokens": 1,
                    "prompt_tokens_details": {"cached_tokens": 30},
                },
            }
        )
    )
    ask = "About: {completion}\nQ{n}? Answer yes or no."
    # One request at a time, as a one-slot server is asked: the order sent is the order served.
    judge = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": "fake-judge",
        "max_concurrency": 1,
    }
    items = [
        {"name": "first", "question": ask.replace("{n}", "1")},
        {"name": "after_first", "question": ask.replace("{n}", "2"),
         "gate": {"reward": "first", "min": 0.5}},
        {"name": "third", "question": ask.replace("{n}", "3")},
    ]  # fmt: skip
    raw = [{"type": "checklist", "items": items, "judges": [judge], "cache": False}]
    with build_reward_set(parse_reward_specs(raw), BuildContext(base_dir=tmp_path)) as rewards:
        started = len(server.requests)  # one start-up question per item
        scores = rewards(["t", "t"], ["A", "B"], {})
    asked = [r["messages"][0]["content"] for r in server.requests[started:]]
    assert asked == [
        "About: A\nQ1? Answer yes or no.",
        "About: A\nQ3? Answer yes or no.",
        "About: B\nQ1? Answer yes or no.",
        "About: B\nQ3? Answer yes or no.",
        "About: A\nQ2? Answer yes or no.",
        "About: B\nQ2? Answer yes or no.",
    ]
    p_yes = 0.6 / 0.9
    for name in ("first", "after_first", "third"):
        assert scores.parts[f"checklist/{name}"].tolist() == pytest.approx([p_yes, p_yes])
        assert scores.metrics[f"judge/{name}/tokens_in"] == 80.0
    # The server's prompt-cache count is summed as it reported it.
    assert scores.metrics["judge/tokens_cached"] == 6 * 30
    assert scores.metrics["judge/ask_ahead_seconds"] > 0


def test_a_request_that_failed_ahead_is_asked_again(
    fake_judge: FakeFactory, tmp_path: Path
) -> None:
    from grpokit.rewards.judge.backends.ahead import AskAheadBackend
    from grpokit.rewards.judge.backends.openai import OpenAIBackend
    from grpokit.rewards.judge.config import OpenAIJudge

    server = fake_judge(
        lambda request, n: Answer(status=500) if n == 0 else Answer(content=f"reply {n}")
    )
    # One request at a time, so that the requests are numbered in the order they are asked.
    spec = OpenAIJudge(
        backend="openai",
        base_url=server.base_url,
        model="fake-judge",
        max_retries=0,
        max_concurrency=1,
    )
    backend = AskAheadBackend(OpenAIBackend(spec, where="judges[0]"))
    try:
        backend.ask_ahead(["a", "b", "a"], logprobs=False)
        assert len(server.requests) == 2  # a repeated prompt is asked once
        replies = backend.complete(["b", "a"], logprobs=False)
        # "b" came from what was kept; "a" had failed ahead and is asked now.
        assert [r.text for r in replies] == ["reply 1", "reply 2"]
        backend.forget()
        assert backend.complete(["b"], logprobs=False)[0].text == "reply 3"
    finally:
        backend.close()


def test_a_batch_forgotten_meanwhile_keeps_the_replies_it_found() -> None:
    from grpokit.rewards.judge.backends.ahead import AskAheadBackend
    from grpokit.rewards.judge.backends.base import JudgeReply

    class OtherBatchEnds:
        """A backend during whose request another batch scored with the same checklist ends
        (and forgets what was asked ahead)."""

        identity = description = "in-process"

        def complete(self, prompts: list[str], *, logprobs: bool) -> list[JudgeReply]:
            backend.forget()
            return [JudgeReply(text=f"reply to {p}") for p in prompts]

        def close(self) -> None:
            pass

    backend = AskAheadBackend(OtherBatchEnds())  # type: ignore[arg-type]
    backend.ask_ahead(["a"], logprobs=False)
    replies = backend.complete(["a", "b"], logprobs=False)
    assert [r.text for r in replies] == ["reply to a", "reply to b"]
