"""Group-relative judging (scoring: group): the group prompt, the seeded shuffle and its undoing,
reply parsing and parse failures, the cache, the cost metrics and the gate, against a scripted
judge server; and group scoring on the real llama.cpp server."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest

from grpokit.errors import UserError
from grpokit.rewards import BuildContext, build_reward_set
from grpokit.rewards.judge import JudgeParams, build_judge_reward
from grpokit.rewards.judge.group import answers_block, group_order, parse_group_reply
from grpokit.rewards.judge.reward import JudgeReward
from grpokit.rewards.spec import parse_reward_specs
from tests.rewards.results import evaluate, judged

from .conftest import Answer, FakeJudge, LlamaServer
from .test_llama_server import llama_judge

GROUP_RUBRIC = (
    "Request: {prompt}\n\n{completions}\n\n"
    "Score each of the {count} answers from 0 to 1, one line `N: score` per answer."
)
_ANSWER_RE = re.compile(r'<answer id="(\d+)">\n(.*?)\n</answer>', re.DOTALL)
_VALUE_RE = re.compile(r"worth (\d\.\d)")


def shown_answers(request: dict[str, Any]) -> list[tuple[int, str]]:
    """(number, text) of each answer in a group prompt, as the judge saw them."""
    content = request["messages"][0]["content"]
    return [(int(n), text) for n, text in _ANSWER_RE.findall(content)]


def fair(request: dict[str, Any], n: int) -> Answer:
    """A judge that gives each answer the value written in it ("worth 0.7"), by number."""
    lines = []
    for number, text in shown_answers(request):
        value = _VALUE_RE.search(text)
        lines.append(f"Answer {number}: {value.group(1) if value else '0.0'}")
    return Answer(
        body={
            "choices": [{"index": 0, "message": {"content": "\n".join(lines)}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        }
    )


def group_reward(server: FakeJudge, tmp_path: Path, **params: Any) -> JudgeReward:
    spec = JudgeParams.model_validate(
        {
            "scoring": "group",
            "group_rubric": GROUP_RUBRIC,
            "judges": [
                {
                    "backend": "openai",
                    "base_url": server.base_url,
                    "model": "fake-judge",
                    "backoff_s": 0.01,
                    "check_at_start": False,
                    "price_per_million_input_tokens": 1.0,
                }
            ],
            **params,
        }
    )
    return build_judge_reward(spec, tmp_path, tmp_path)


# ---- pure parts --------------------------------------------------------------------------------


def test_group_order_is_a_seeded_permutation() -> None:
    texts = ["a", "b", "c", "d"]
    order = group_order(texts, seed=0)
    assert sorted(order) == [0, 1, 2, 3]
    assert group_order(texts, seed=0) == order  # the same group is shown the same way again
    # Another seed, another salt or other texts draw other orders.
    draws = {tuple(group_order(texts, seed=s)) for s in range(8)}
    draws |= {tuple(group_order(texts, seed=0, salt=s)) for s in range(8)}
    assert len(draws) > 4
    assert group_order([], seed=0) == []


def test_answers_block_numbers_the_answers_in_the_order_shown() -> None:
    assert answers_block(["first text", "second\ntext"]) == (
        '<answer id="1">\nfirst text\n</answer>\n\n<answer id="2">\nsecond\ntext\n</answer>'
    )


@pytest.mark.parametrize(
    ("reply", "scale", "expected"),
    [
        ("1: 0.6\n2: 0.3\n3: 1", (0, 1), {1: 0.6, 2: 0.3, 3: 1.0}),
        ("Answer 2 - 3/5\nAnswer 1: 5/5", (0, 1), {1: 1.0, 2: 0.6}),
        ("**1**: 4\n**2**: 2\n[3] 5", (0, 5), {1: 4.0, 2: 2.0}),  # "[3] 5" has no separator
        ('{"1": 0.6, "3": 0.2}', (0, 1), {1: 0.6, 3: 0.2}),
        (
            '{"scores": [{"id": 3, "score": 0.9}, {"id": 1, "score": 0.1}]}',
            (0, 1),
            {1: 0.1, 3: 0.9},
        ),
        ("回答1：８点\n回答2：3点", (0, 10), {1: 8.0, 2: 3.0}),
        # The judge reasons first, naming answers; its verdict comes last and wins.
        ("Answer 2 is better than answer 1.\n1: 0.2\n2: 0.8", (0, 1), {1: 0.2, 2: 0.8}),
        # No labels: one number per line, exactly as many as answers, read in order.
        ("0.4\n0.9\n0.1", (0, 1), {1: 0.4, 2: 0.9, 3: 0.1}),
        ("0.4\n0.9", (0, 1), {}),  # two numbers for three answers: which is which is unknown
        ("1. good\n2. bad\n3. fine", (0, 1), {}),  # a list, no scores
        ("1: 7\n2: 0.5\n4: 0.9", (0, 1), {2: 0.5}),  # 7 is off the scale; there is no answer 4
        ("I like them all.", (0, 1), {}),
    ],
)
def test_parse_group_reply(
    reply: str, scale: tuple[float, float], expected: dict[int, float]
) -> None:
    found = parse_group_reply(reply, 3, *scale)
    assert {n: p.value for n, p in found.items()} == expected
    for parsed in found.values():  # the offsets point at the number written in the reply
        assert float(reply[parsed.start : parsed.end].translate({0xFF18: "8"})) == parsed.number


def test_group_config_errors() -> None:
    judge = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    with pytest.raises(pydantic.ValidationError, match="scoring: group .* set group_rubric"):
        JudgeParams.model_validate(
            {"scoring": "group", "rubric": "{completion}", "judges": [judge]}
        )
    with pytest.raises(pydantic.ValidationError, match="judges 0 have their own rubric"):
        JudgeParams.model_validate(
            {
                "scoring": "group",
                "group_rubric": "{completions}",
                "judges": [{**judge, "rubric": "{completion}"}],
            }
        )
    # A group rubric without {completions}: one message naming the field.
    params = JudgeParams.model_validate(
        {"scoring": "group", "group_rubric": "{completion}", "judges": [judge]}
    )
    with pytest.raises(UserError, match=r"judge\.group_rubric: .* no \{completions\}"):
        build_judge_reward(params, Path("."))


# ---- against a scripted judge server -------------------------------------------------------------


def test_group_prompt_shuffle_and_scores_mapped_back(
    fake_judge: Callable[..., FakeJudge], tmp_path: Path
) -> None:
    server = fake_judge(fair)
    reward = group_reward(server, tmp_path, shuffle_seed=3)
    completions = [
        "Alpha, worth 0.1",
        "Bravo, worth 0.9",
        "Charlie, worth 0.5",
        "Delta, worth 0.3",  # another prompt
        "Bravo, worth 0.9",  # the policy repeated itself: shown once, scored alike
    ]
    prompts = ["Topic one", "Topic one", "Topic one", "Topic two", "Topic one"]
    try:
        result = evaluate(reward, prompts, completions)
        scores = result.values
        groups = judged(result).groups
        metrics = result.metrics
        outcomes = judged(result).outcomes[0]
    finally:
        reward.close()
    # Every completion got the value written in it, whatever position it was shown in.
    assert scores == [0.1, 0.9, 0.5, 0.3, 0.9]
    assert len(server.requests) == 2  # one request per prompt
    # The order seed 3 draws for the first group's three distinct answers (in order of first
    # appearance: Alpha, Bravo, Charlie): number 1 shows Bravo, number 2 Charlie, number 3 Alpha.
    distinct = ["Alpha, worth 0.1", "Bravo, worth 0.9", "Charlie, worth 0.5"]
    assert group_order(distinct, 3) == [1, 2, 0]
    # The two requests go out concurrently, so the server's log holds them in either order.
    sent = sorted(request["messages"][0]["content"] for request in server.requests)
    assert sent[0] == (
        "Request: Topic one\n\n"
        '<answer id="1">\nBravo, worth 0.9\n</answer>\n\n'
        '<answer id="2">\nCharlie, worth 0.5\n</answer>\n\n'
        '<answer id="3">\nAlpha, worth 0.1\n</answer>\n\n'
        "Score each of the 3 answers from 0 to 1, one line `N: score` per answer."
    )
    assert sent[1].startswith("Request: Topic two") and sent[1].count("<answer id=") == 1
    # The order is recorded: per number shown, the rows it stands for.
    first = groups[0]
    assert first.rows == (0, 1, 2, 4)
    assert first.shown == ((1, 4), (2,), (0,))
    assert first.missing == () and first.reply is not None
    assert [o.position for o in outcomes] == [3, 1, 2, 1, 1]
    assert metrics["judge/group_size"] == pytest.approx(2.0)  # 3 and 1 distinct answers
    assert metrics["judge/parse_failure_rate"] == 0.0
    assert metrics["judge/group_parse_failure_rate"] == 0.0
    # Usage once per request: 2 requests of 100 prompt and 10 reply tokens, priced 1 per M in.
    assert metrics["judge/tokens_in"] == 200.0 and metrics["judge/tokens_out"] == 20.0
    assert metrics["judge/cost"] == pytest.approx(200 / 1e6)


def test_a_missed_answer_gets_none_and_counts_as_a_parse_failure(
    fake_judge: Callable[..., FakeJudge], tmp_path: Path
) -> None:
    def forgetful(request: dict[str, Any], n: int) -> Answer:
        # Scores every answer but the one shown last.
        answers = shown_answers(request)[:-1]
        lines = [f"{k}: {_VALUE_RE.search(t).group(1)}" for k, t in answers]  # type: ignore[union-attr]
        return Answer(content="\n".join(lines))

    server = fake_judge(forgetful)
    reward = group_reward(server, tmp_path)
    completions = ["A, worth 0.2", "B, worth 0.4", "C, worth 0.6", "D, worth 0.8"]
    try:
        result = evaluate(reward, ["Topic"] * 4, completions)
        scores = result.values
        metrics = result.metrics
        group = judged(result).groups[0]
        warning = judged(result).warning
    finally:
        reward.close()
    last_shown = group.shown[-1][0]
    assert group.missing == (4,)
    assert scores[last_shown] is None  # no score, never a low one
    assert [s for i, s in enumerate(scores) if i != last_shown] == [
        float(completions[i][-3:]) for i in range(4) if i != last_shown
    ]
    assert metrics["judge/parse_failure_rate"] == pytest.approx(0.25)
    assert metrics["judge/group_parse_failure_rate"] == 1.0
    assert metrics["judge/none_rate"] == pytest.approx(0.25)
    assert warning is not None and "for some answers" in warning and "`N: score`" in warning


def test_group_scores_come_from_the_cache_whole(
    fake_judge: Callable[..., FakeJudge], tmp_path: Path
) -> None:
    server = fake_judge(fair)
    completions = ["A, worth 0.2", "B, worth 0.7", "C, worth 0.5"]
    first = group_reward(server, tmp_path)
    try:
        assert first(["Topic"] * 3, completions) == [0.2, 0.7, 0.5]
    finally:
        first.close()
    again = group_reward(server, tmp_path)
    try:
        result = evaluate(again, ["Topic"] * 3, completions)
        assert result.values == [0.2, 0.7, 0.5]
        assert result.metrics["judge/cache_hit_rate"] == 1.0
        assert result.metrics["judge/tokens_in"] == 0.0  # cached answers cost nothing
        assert judged(result).groups[0].cached
        assert len(server.requests) == 1
        # Another draw of the order is another judge prompt: asked afresh, mapped back alike.
        drawn = group_order(completions, 0, 0)
        salt = next(s for s in range(1, 20) if group_order(completions, 0, s) != drawn)
        batch = again.judge_batch(["Topic"] * 3, completions, {}, shuffle_salt=salt)
        assert batch.scores == [0.2, 0.7, 0.5]
        assert len(server.requests) == 2
    finally:
        again.close()


def test_gated_out_completions_are_not_shown_to_the_judge(
    fake_judge: Callable[..., FakeJudge], tmp_path: Path
) -> None:
    server = fake_judge(fair)
    judge = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": "fake-judge",
        "check_at_start": False,
    }
    specs = parse_reward_specs(
        [
            {"type": "xml_format", "tags": ["proposal"]},
            {
                "type": "judge",
                "name": "quality",
                "gate": {"reward": "xml_format", "min": 1.0},
                "scoring": "group",
                "group_rubric": GROUP_RUBRIC,
                "judges": [judge],
            },
        ]
    )
    completions = [
        "<proposal>\nA, worth 0.8\n</proposal>",
        "no tags, worth 0.9",
        "<proposal>\nC, worth 0.4\n</proposal>",
    ]
    with build_reward_set(specs, BuildContext(base_dir=tmp_path, run_dir=tmp_path)) as rewards:
        scores = rewards(["Topic"] * 3, completions, {})
    assert scores.column("quality") == pytest.approx([0.8, 0.0, 0.4])  # 0.0: the gate's otherwise
    assert scores.gated_out[:, 1].tolist() == [False, True, False]
    assert len(server.requests) == 1
    shown = [text for _, text in shown_answers(server.requests[0])]
    assert sorted(shown) == sorted([completions[0], completions[2]])


def test_startup_check_asks_a_group_and_needs_every_score(
    fake_judge: Callable[..., FakeJudge], tmp_path: Path
) -> None:
    server = fake_judge(lambda request, n: Answer(content="1: 1"))  # forgets answer 2
    params = JudgeParams.model_validate(
        {
            "scoring": "group",
            "group_rubric": GROUP_RUBRIC,
            "judges": [{"backend": "openai", "base_url": server.base_url, "model": "fake-judge"}],
        }
    )
    with pytest.raises(UserError, match=r"for some answers: '1: 1'.*`N: score`"):
        build_judge_reward(params, tmp_path, tmp_path)
    assert len(shown_answers(server.requests[-1])) == 2


# ---- the real llama.cpp server ---------------------------------------------------------------------

REAL_RUBRIC = (
    "Business ideas for: {prompt}\n\n{completions}\n\n"
    "Rate each of the {count} ideas from 1 to 5. Write one line per idea: its number, a colon, "
    "the rating.\n"
)


def test_group_scoring_on_the_real_judge(llama_server: LlamaServer, tmp_path: Path) -> None:
    ideas = [
        "A subscription service delivering healthy meals to busy office workers for 30 USD a week.",
        "An app.",
        "A repair cafe where retired engineers fix appliances for a 5 USD fee.",
    ]
    # llama.cpp's grammar holds the 135M model to the `N: rating` form (it rambles otherwise).
    grammar = 'root ::= "1: " [1-5] "\\n2: " [1-5] "\\n3: " [1-5]'
    params = JudgeParams.model_validate(
        {
            "scoring": "group",
            "group_rubric": REAL_RUBRIC,
            "score_range": [1, 5],
            "mode": "expected",
            "judges": [
                # The start-up pair has two answers; this grammar writes three lines.
                llama_judge(
                    llama_server,
                    max_tokens=16,
                    extra_body={"grammar": grammar},
                    check_at_start=False,
                )
            ],
        }
    )
    reward = build_judge_reward(params, tmp_path, tmp_path)
    try:
        result = evaluate(reward, ["office workers"] * 3, ideas)
        scores = result.values
        metrics = result.metrics
        group = judged(result).groups[0]
    finally:
        reward.close()
    assert group.reply is not None and re.fullmatch(r"1: [1-5]\n2: [1-5]\n3: [1-5]", group.reply)
    assert metrics["judge/parse_failure_rate"] == 0.0
    assert metrics["judge/expected_fallback_rate"] == 0.0  # logprobs read at each rating
    assert metrics["judge/request_failure_rate"] == 0.0
    assert all(s is not None and 0.0 <= s <= 1.0 for s in scores)
    assert metrics["judge/tokens_in"] > 0  # llama.cpp reports usage


# ---- the audit: absolute against group scoring ---------------------------------------------------


def test_audit_compares_absolute_and_group_scoring(
    fake_judge: Callable[..., FakeJudge], tmp_path: Path
) -> None:
    import json

    import yaml
    from click.testing import CliRunner

    from grpokit.rewards.judge.cli import judge_cli

    def biased(request: dict[str, Any], n: int) -> Answer:
        content = request["messages"][0]["content"]
        if "<answer id=" not in content:  # absolute: the value written in the answer
            value = _VALUE_RE.search(content)
            return Answer(content=value.group(1) if value else "0.0")
        lines = []  # group: the same values, and 0.1 more for whatever is shown first
        for number, text in shown_answers(request):
            value = _VALUE_RE.search(text)
            score = float(value.group(1)) if value else 0.0
            lines.append(f"{number}: {min(1.0, score + (0.1 if number == 1 else 0.0)):.1f}")
        return Answer(content="\n".join(lines))

    server = fake_judge(biased)
    config = {
        "model": {"name_or_path": "smollm2-135m-instruct"},
        "data": {"train": "train.jsonl"},
        "rewards": [
            {
                "type": "judge",
                "rubric": "Score 0-1.\n- Revenue model: +0.2 points\n{completion}",
                "group_rubric": GROUP_RUBRIC,
                "judges": [
                    {"backend": "openai", "base_url": server.base_url, "model": "fake-judge"}
                ],
            }
        ],
    }
    (tmp_path / "train.jsonl").write_text('{"prompt": "p"}\n', encoding="utf-8")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    completions = tmp_path / "completions.jsonl"
    rows = [
        {"prompt": "topic one", "completion": "A plan, worth 0.6"},
        {"prompt": "topic one", "completion": "A better plan, worth 0.8"},
    ]
    completions.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    output = tmp_path / "comparison.json"
    result = CliRunner().invoke(
        judge_cli,
        ["audit", str(path), "--completions", str(completions), "--k", "4",
         "--planted-prompts", "1", "--compare-scoring", "--output", str(output)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "absolute vs group scoring" in result.output
    report = json.loads(output.read_text())
    absolute, group = report["absolute"], report["group"]
    assert absolute["scoring"] == "absolute" and group["scoring"] == "group"
    assert absolute["items"] == group["items"] == 2
    # The same planted answers on both sides, scored 0 by this judge (no value written), or
    # 0.1 by the group judge when shown first.
    assert [p["kind"] for p in absolute["planted"]] == [p["kind"] for p in group["planted"]]
    assert all(p["mean"] == 0.0 for p in absolute["planted"])
    assert all(0.0 <= p["mean"] <= 0.1 for p in group["planted"])
    # The greedy absolute judge repeats itself; the group judge's favour for the first
    # position moves from answer to answer as every repeat draws another order.
    assert absolute["reward_noise"] == 0.0
    assert group["reward_noise"] > 0.0
    assert absolute["ensemble_mean"] == pytest.approx(0.7)
    assert 0.7 <= group["ensemble_mean"] <= 0.8
    assert absolute["separation"] == group["separation"] == 1.0
    # Position bias, measured within answers: this judge adds exactly 0.1 to whatever it is
    # shown first, so every answer seen first and elsewhere scores 0.1 more when first; shown
    # last it scores less than elsewhere (where it was sometimes first), never more.
    assert absolute["position_bias"] == {}
    ((first, last),) = group["position_bias"].values()
    assert first["slot"] == "first" and first["answers"] >= 1 and first["prompts"] == 1
    assert first["contrast"] == pytest.approx(0.1)
    assert last["slot"] == "last" and last["answers"] >= 1 and last["contrast"] <= 0.0
    assert "position bias of judge" in result.output and "first +0.100" in result.output
    # Absolute: start-up sample + 7 answers x 4 repeats; group: start-up pair + 1 group x 4.
    contents = [r["messages"][0]["content"] for r in server.requests]
    assert sum("<answer id=" in c for c in contents) == 1 + 4
    assert len(contents) == 1 + 7 * 4 + 1 + 4


@pytest.mark.parametrize("name", ["config.openai.group.en.yaml", "config.openai.group.yaml"])
def test_recipe_group_configs(name: str) -> None:
    from grpokit.config import load_config
    from grpokit.recipes import recipe_dir
    from grpokit.rewards.judge.reward import render_group
    from grpokit.rewards.judge.rubric import load_rubric

    recipe = recipe_dir("business-ideas")
    config = load_config(recipe / name)
    params = config.rewards[1].params
    assert isinstance(params, JudgeParams)
    assert params.scoring == "group" and params.score_range == (0.0, 5.0)
    # Everything but the quality reward is the absolute server config's.
    absolute = load_config(recipe / name.replace(".group", ""))
    assert config.model_dump(exclude={"rewards"}) == absolute.model_dump(exclude={"rewards"})
    group = load_rubric(None, params.group_rubric_file, recipe, "g", placeholder="completions")
    text = render_group(group, "Target: bakers.", ["First idea.", "Second idea."], {})
    assert text.count('<answer id="') == 2 and "Target: bakers." in text
    assert "2" in text.split("</answer>")[-1]  # the count of answers is in the instructions
    load_rubric(None, params.rubric_file, recipe, "r")  # the absolute side of the comparison
