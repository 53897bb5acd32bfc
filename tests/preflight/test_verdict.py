"""The verdict and its advice on synthetic measurements: cold start, go, low signal, saturated."""

from __future__ import annotations

import pytest

from grpokit.core.stats import wilson_interval
from grpokit.preflight.measure import (
    CompletionStats,
    DrawRecord,
    Measurement,
    PartialCredit,
    RewardInfo,
    RewardStats,
    ToolInfo,
    ToolStats,
)
from grpokit.preflight.verdict import decide, mixed_group_probability

SYSTEM = "Reply as <thinking>...</thinking><answer>...</answer>"


def _stats(name: str, passed: int, n: int = 64, zv: float = 0.0, **kw: float) -> RewardStats:
    return RewardStats(
        name=name,
        samples=n,
        applicable=n,
        mean=passed / n,
        passed=passed,
        interval=wilson_interval(passed, n),
        zero_variance_share=zv,
        none_share=kw.get("none_share", 0.0),
        gated_out_share=kw.get("gated_out_share", 0.0),
    )


def _measurement(
    rewards: list[RewardStats],
    zv: float,
    *,
    distinct: float = 0.9,
    truncated: float = 0.0,
    system_prompt: str | None = SYSTEM,
    temperature: float = 1.0,
    partial: list[PartialCredit] | None = None,
    tools: ToolStats | None = None,
) -> Measurement:
    infos = [
        RewardInfo("format", "xml_format", tags=("thinking", "answer")),
        RewardInfo("answer", "math_answer", gate="format"),
    ][: len(rewards)]
    return Measurement(
        settings=DrawRecord(8, 8, temperature, 1.0, 0, 64, 0.04, "group", system_prompt, 0),
        infos=infos,
        rewards=rewards,
        total_mean=sum(r.mean for r in rewards),
        total_zero_variance_share=zv,
        completions=CompletionStats(40.0, 12, 64, truncated, 35.0, 1.8, distinct),
        partial_credit=partial or [],
        tools=tools,
    )


def test_cold_start_exit_1_with_backed_advice() -> None:
    m = _measurement(
        [_stats("format", 0, zv=1.0), _stats("answer", 0, zv=1.0, gated_out_share=1.0)],
        zv=1.0,
        partial=[PartialCredit("format", "tags_present", ("thinking", "answer"), 0.42, 0.25)],
    )
    v = decide(m)
    assert v.status == "cold_start" and v.exit_code == 1
    text = "\n".join(v.reasons + v.advice)
    assert "100% of the 8 groups of 8 have equal total rewards" in text
    # The gate comes first: format is what blocks everything.
    assert "format 0/64 at its maximum (95% CI 0.0%-5.7%): cold start" in v.reasons[1]
    assert "answer was never computed: its gate on format stayed closed" in text
    advice = "\n".join(v.advice)
    assert "grpokit sft CONFIG --data" in advice and "format passed 0/64" in advice
    assert "--from-rollouts" in advice and "would keep nothing" in advice
    # Partial credit measured on the same completions: mean 0.42, 75% of groups unequal.
    assert "scores these same completions 0.42 on average with 75% of groups unequal" in advice
    # At the Wilson upper bound 5.66%: 1 - (1 - 0.0566)^8 = 37%, G=16: 61%, G=32: 85%.
    assert "G=8: 37%, G=16: 61%, G=32: 85%" in advice
    assert "temperature 1" in advice and "1.80 nats/token" in advice
    assert "names the tags already" in advice


def test_cold_start_system_prompt_without_tags() -> None:
    m = _measurement([_stats("format", 0, zv=1.0)], zv=1.0, system_prompt="Be helpful.")
    v = decide(m)
    assert any("does not show the tag(s) <thinking>, <answer>" in a for a in v.advice)
    m = _measurement([_stats("format", 0, zv=1.0)], zv=1.0, system_prompt=None)
    assert any("there is none" in a for a in decide(m).advice)


def test_cold_start_partial_credit_that_would_not_help() -> None:
    partial = [PartialCredit("format", "tags_present", ("thinking", "answer"), 0.0, 1.0)]
    v = decide(_measurement([_stats("format", 0, zv=1.0)], zv=1.0, partial=partial))
    assert any("would not help yet" in a for a in v.advice)


def test_go() -> None:
    m = _measurement([_stats("format", 40, zv=0.25), _stats("answer", 20, zv=0.5)], zv=0.25)
    v = decide(m)
    assert v.status == "go" and v.exit_code == 0
    assert v.reasons[0].startswith("75% of the 8 groups carry a learning signal")
    assert "format 40/64 (95% CI 50.3%-73.3%)" in v.reasons[0]
    assert v.advice == []


def test_low_signal_many_flat_groups() -> None:
    m = _measurement([_stats("format", 3, zv=0.75)], zv=0.75)
    v = decide(m)
    assert v.status == "low_signal" and v.exit_code == 0
    advice = "\n".join(v.advice)
    # p = 3/64 = 0.046875: (1 - p)^8 = exp(8 ln 0.953125) = exp(-0.384074) = 0.681081,
    # p^8 ~ 2e-11, so 1 - p^8 - (1 - p)^8 = 0.318919.
    assert mixed_group_probability(3 / 64, 8) == pytest.approx(0.318919, abs=1e-6)
    assert "G=8: 32%" in advice
    assert "dynamic_sampling: true" in advice and "about 4.0x" in advice


def test_low_signal_collapsed_sampling() -> None:
    m = _measurement([_stats("format", 30, zv=0.25)], zv=0.25, distinct=0.25)
    v = decide(m)
    assert v.status == "low_signal"
    assert any("only 25% of completions within a group are distinct" in r for r in v.reasons)
    assert any("fewer steps" in a for a in v.advice)


def test_saturated() -> None:
    m = _measurement([_stats("format", 64, zv=1.0)], zv=1.0)
    v = decide(m)
    assert v.status == "saturated" and v.exit_code == 1
    assert "format: 64/64" in v.reasons


def test_notes_for_stuck_gated_reward_while_format_learns() -> None:
    m = _measurement([_stats("format", 20, zv=0.3), _stats("answer", 0, zv=1.0)], zv=0.3)
    v = decide(m)
    assert v.status == "go"
    assert any("answer passed 0/64" in n and "format is being learned" in n for n in v.notes)


def test_truncation_warning() -> None:
    m = _measurement([_stats("format", 20, zv=0.3)], zv=0.3, truncated=0.5)
    v = decide(m)
    assert any("50% of completions hit max_completion_length=64" in r for r in v.reasons)


def test_mixed_group_probability_hand_values() -> None:
    # p = 0.5, G = 2: half the groups are mixed; p = 0 or 1: never.
    assert mixed_group_probability(0.5, 2) == pytest.approx(0.5)
    assert mixed_group_probability(0.0, 8) == 0.0
    assert mixed_group_probability(1.0, 8) == 0.0


def _tools(
    calling: int,
    unparsed: int = 0,
    *,
    lenient: bool = False,
    fmt: str = "hermes",
    template: str | None = None,
    replaced: bool = False,
) -> ToolStats:
    """64 completions of which ``calling`` called the calculator (once each, none failed) and
    ``unparsed`` wrote a call outside the format."""
    info = ToolInfo(("calculator",), fmt, lenient, template, replaced)
    return ToolStats(info, 64, calling, calling, 0, unparsed, unparsed)


def test_a_tool_never_called_is_a_cold_start_though_the_rewards_say_go() -> None:
    """The issue's case: answers without the tool vary in reward (GO on the rewards alone),
    no completion calls the calculator, 15 of 64 write the call as bare JSON."""
    rewards = [_stats("format", 40, zv=0.25), _stats("answer", 20, zv=0.5)]
    assert decide(_measurement(rewards, zv=0.25)).status == "go"
    tools = _tools(0, 15, template="hermes", replaced=True)
    v = decide(_measurement(rewards, zv=0.25, system_prompt="Be careful.", tools=tools))
    assert v.status == "cold_start" and v.exit_code == 1
    assert v.reasons[0].startswith("no completion called a tool: 0/64 called calculator (95% CI")
    assert "training would teach answering without the tool (cold start)" in v.reasons[0]
    assert (
        "15/64 completions wrote 15 call(s) of calculator outside the hermes format"
        in (v.reasons[1])
    )
    assert "not run, training.tool_call_lenient is off" in v.reasons[1]
    assert (
        "75% of the 8 groups carry a reward signal, all of it from answers without"
        in (v.reasons[2])
    )
    advice = "\n".join(v.advice)
    # The format cold start's advice, for the call: demonstrations first.
    assert v.advice[0].startswith("SFT warm-start on tool-call demonstrations: `grpokit sft")
    assert "0/64 called a tool" in v.advice[0] and "`--from-rollouts` does not take" in advice
    assert "training.tool_call_lenient: true: 15/64 completions" in advice
    assert "model.chat_template: hermes replaces the model's own chat template" in advice
    assert "`auto` (or no setting) keeps the model's own" in advice
    assert "temperature 1" in advice and "1.80 nats/token" in advice
    # 0/64: the Wilson upper bound is 5.66%, 1 - (1 - 0.0566)^8 = 37%.
    assert "a group holds a call with probability at most G=8: 37%, G=16: 61%" in advice
    assert '<tool_call>{"name": "calculator", "arguments": {...}}</tool_call>' in advice


def test_tool_cold_start_advice_follows_what_was_measured() -> None:
    rewards = [_stats("format", 0, zv=1.0)]
    v = decide(_measurement(rewards, zv=1.0, system_prompt=None, tools=_tools(0)))
    assert v.status == "cold_start"
    assert any("none of the 8 groups carries a reward signal either" in r for r in v.reasons)
    advice = "\n".join(v.advice)
    assert "Lenient parsing (training.tool_call_lenient) would not help yet" in advice
    assert "replaces the model's own" not in advice
    assert "there is none; set data.system_prompt" in advice
    lenient = decide(_measurement(rewards, zv=1.0, tools=_tools(0, lenient=True, fmt="llama3")))
    assert not any("Lenient" in a for a in lenient.advice)
    assert any('{"name": "calculator", "parameters": {...}}' in a for a in lenient.advice)


def test_calls_outside_the_format_are_warned_about_when_some_calls_run() -> None:
    rewards = [_stats("format", 40, zv=0.25)]
    v = decide(_measurement(rewards, zv=0.25, tools=_tools(30, 5)))
    assert v.status == "go"
    assert any("5/64 completions wrote 5 call(s)" in r and "not run;" in r for r in v.reasons)
    v = decide(_measurement(rewards, zv=0.25, tools=_tools(30, 5, lenient=True)))
    assert any("run only because training.tool_call_lenient is on" in r for r in v.reasons)
    assert decide(_measurement(rewards, zv=0.25, tools=_tools(30))).reasons == (
        decide(_measurement(rewards, zv=0.25)).reasons
    )
