"""From a measurement to a verdict (go / low signal / cold start / saturated) and advice.

Every piece of advice quotes the numbers it rests on, so a user can judge it. Pure functions of a
:class:`~grpokit.preflight.measure.Measurement`; no I/O.

Statuses and exit codes:
    go          0   enough groups carry a learning signal.
    low_signal  0   training will learn, slowly: many groups are flat, or sampling has collapsed.
    cold_start  1   every group has equal total rewards and nothing reaches its maximum: no
                    gradient at all (the "loss = 0" run); or, with tools, no completion called
                    one: GRPO cannot reward a call it never samples.
    saturated   1   every group is flat because everything already passes: nothing to learn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from grpokit.preflight.measure import Measurement, RewardStats, ToolStats

Status = Literal["go", "low_signal", "cold_start", "saturated"]

EXIT_CODES: dict[str, int] = {"go": 0, "low_signal": 0, "cold_start": 1, "saturated": 1}

LOW_SIGNAL_SHARE = 0.5
"""A zero-variance share of the total reward at or above this is reported as low signal."""
COLLAPSED_DISTINCT = 0.5
"""Fewer distinct completions per group than this share means sampling has nearly collapsed."""
TRUNCATION_WARNING = 0.25
"""A truncated share at or above this gets its own warning."""


@dataclass(frozen=True)
class Verdict:
    status: Status
    reasons: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    @property
    def headline(self) -> str:
        return {
            "go": "GO: the rewards give GRPO a learning signal",
            "low_signal": "GO, LOW SIGNAL: training will learn, but slowly",
            "cold_start": "COLD START: no group carries a learning signal; training would not learn",
            "saturated": "SATURATED: every sample already passes; training has nothing to learn",
        }[self.status]


def mixed_group_probability(p: float, group_size: int) -> float:
    """Probability that a group of G samples with pass rate p holds both a pass and a fail."""
    return max(0.0, 1.0 - p**group_size - (1.0 - p) ** group_size)


def any_pass_probability(p: float, group_size: int) -> float:
    """Probability that a group of G samples with pass rate p holds at least one pass."""
    return 1.0 - (1.0 - p) ** group_size


def _count(r: RewardStats) -> str:
    return f"{r.passed}/{r.applicable}"


def _ci(r: RewardStats) -> str:
    assert r.interval is not None
    return f"95% CI {r.interval[0]:.1%}-{r.interval[1]:.1%}"


def _stuck(m: Measurement) -> list[RewardStats]:
    """Rewards with a maximum that no applicable sample reached, gates first."""
    gating = {i.gate for i in m.infos if i.gate}
    stuck = [r for r in m.rewards if r.passed == 0 and r.applicable > 0]
    return sorted(stuck, key=lambda r: r.name not in gating)


def _format_example(tags: tuple[str, ...]) -> str:
    return "".join(f"<{t}>...</{t}>" for t in tags)


def _system_prompt_advice(m: Measurement, r: RewardStats) -> str:
    info = m.info(r.name)
    prompt = m.settings.system_prompt
    if not info.tags:
        return (
            f"A clearer system prompt: state exactly what {r.name!r} checks and show one answer "
            f"that passes it ({r.name} passed {_count(r)})."
        )
    example = _format_example(info.tags)
    if not prompt:
        return (
            f"A clearer system prompt: there is none; set data.system_prompt to one that shows "
            f"the exact format {example} with a complete worked example ({r.name} passed "
            f"{_count(r)})."
        )
    missing = [t for t in info.tags if f"<{t}>" not in prompt]
    if missing:
        return (
            f"A clearer system prompt: it does not show the tag(s) "
            f"{', '.join(f'<{t}>' for t in missing)}; spell out {example} with a worked example."
        )
    return (
        "A clearer system prompt: it names the tags already; a complete worked example answer in "
        f"it helps a small model more than a description ({r.name} passed {_count(r)})."
    )


def _generations_advice(m: Measurement, r: RewardStats) -> str:
    g = m.settings.generations
    assert r.interval is not None
    hi = r.interval[1]
    options = ", ".join(f"G={k}: {any_pass_probability(hi, k):.0%}" for k in (g, 2 * g, 4 * g))
    return (
        f"More generations: even at the interval's upper bound ({hi:.1%}) a group holds a pass "
        f"of {r.name!r} with probability at most {options} (training.num_generations)."
    )


def _temperature_advice(m: Measurement) -> str:
    s, c = m.settings, m.completions
    seen = f"sampled at temperature {s.temperature:g}"
    if c.entropy is not None:
        seen += f" with {c.entropy:.2f} nats/token"
    seen += f" and {c.distinct_share:.0%} distinct completions per group"
    if s.temperature < 1.0:
        return f"A higher temperature: {seen}; 1.0 samples the model's own distribution."
    return (
        f"A higher temperature: {seen}; it is already {s.temperature:g}, and much above 1.2 a "
        "small model drifts into noise, so prefer the options above."
    )


def _cold_start_advice(m: Measurement, stuck: list[RewardStats]) -> list[str]:
    advice = []
    focus = stuck[0] if stuck else None
    what = f"{focus.name} passed {_count(focus)} ({_ci(focus)})" if focus else "nothing passed"
    advice.append(
        f"SFT warm-start: `grpokit sft CONFIG --data demos.jsonl` on a few dozen prompt/completion "
        f"pairs that pass; {what}, so the model must be shown the target once before GRPO "
        "can reward it. Then set model.init_from to the SFT checkpoint."
    )
    if focus is not None and focus.interval is not None:
        hi = focus.interval[1]
        advice.append(
            f"`grpokit sft CONFIG --from-rollouts` (keep the model's own passing samples) needs "
            f"passes: {_count(focus)} here, so it would keep nothing; even at {hi:.1%} it takes "
            f"about {math.ceil(1 / hi)} samples per kept one (raise --prompts)."
        )
    for pc in m.partial_credit:
        if focus is None or pc.reward != focus.name:
            continue
        tags = ", ".join(pc.tags)
        if pc.zero_variance_share < 1.0:
            advice.append(
                f"Partial credit: `- type: tags_present` (tags [{tags}]) scores these same "
                f"completions {pc.mean:.2f} on average with {1 - pc.zero_variance_share:.0%} of "
                f"groups unequal ({focus.name}: 0%), so GRPO gets a gradient towards the tags."
            )
        else:
            advice.append(
                f"Partial credit (`- type: tags_present`, tags [{tags}]) would not help yet: it "
                f"is flat in every group on these completions too (mean {pc.mean:.2f}); the "
                "model does not write the tags at all."
            )
    advice.append(_temperature_advice(m))
    if focus is not None and focus.interval is not None:
        advice.append(_generations_advice(m, focus))
        advice.append(_system_prompt_advice(m, focus))
    return advice


_CALL_EXAMPLES = {
    "hermes": '<tool_call>{{"name": "{name}", "arguments": {{...}}}}</tool_call>',
    "llama3": '{{"name": "{name}", "parameters": {{...}}}}',
}
"""A call as each format writes it, for advice."""


def _call_example(t: ToolStats) -> str:
    template = _CALL_EXAMPLES.get(t.info.format or "")
    return template.format(name=t.info.names[0]) if template else "the call format"


def _tool_names(t: ToolStats) -> str:
    return ", ".join(t.info.names)


def _outside(t: ToolStats) -> str:
    """The completions that wrote calls outside the format, as a clause."""
    fmt = f"the {t.info.format} format" if t.info.format else "the tool-call format"
    return (
        f"{t.unparsed}/{t.completions} completions wrote {t.unparsed_calls} call(s) of "
        f"{_tool_names(t)} outside {fmt} (JSON, bare or in a code block)"
    )


def _tool_system_prompt_advice(m: Measurement, t: ToolStats) -> str:
    example = _call_example(t)
    prompt = m.settings.system_prompt
    if not prompt:
        return (
            "A system prompt that shows the call: there is none; set data.system_prompt to one "
            f"with a worked example of a call, {example}, and of the answer written after the "
            "tool's result."
        )
    marker = {"hermes": "<tool_call>", "llama3": '"parameters"'}.get(t.info.format or "")
    if marker is not None and marker not in prompt:
        return (
            f"A system prompt that shows the call: it does not show {example}; a worked "
            "example of a call and of the answer after the tool's result helps a small model "
            "more than the chat template's description of the tools."
        )
    return (
        "A system prompt that shows the call: it names the format already; a complete worked "
        "example (the call, the tool's result, the answer) helps a small model more than a "
        "description."
    )


def _tool_cold_start(m: Measurement, t: ToolStats, warnings: list[str]) -> Verdict:
    """No completion called a tool: the cold start of tool use, with the format cold start's
    kind of advice (demonstrations, sampling, the prompt) and tools' own (leniency, template)."""
    low, high = t.interval
    zv = m.total_zero_variance_share
    reasons = [
        f"no completion called a tool: {t.calling}/{t.completions} called {_tool_names(t)} "
        f"(95% CI {low:.1%}-{high:.1%}): GRPO cannot reward a call it never samples, and "
        "training would teach answering without the tool (cold start)"
    ]
    if t.unparsed and not t.info.lenient:
        reasons.append(f"{_outside(t)}: not run, training.tool_call_lenient is off")
    groups = f"the {m.settings.prompts} groups"
    if zv < 1.0:
        reasons.append(
            f"{1 - zv:.0%} of {groups} carry a reward signal, all of it from answers without "
            "the tool"
        )
    else:
        reasons.append(f"none of {groups} carries a reward signal either (equal total rewards)")
    advice = [
        f"SFT warm-start on tool-call demonstrations: `grpokit sft CONFIG --data demos.jsonl` "
        "with a few dozen conversations in TRL's form (an assistant turn with tool_calls, the "
        "tool message, the answer; the tool-arithmetic recipe's demos.jsonl is one); "
        f"{t.calling}/{t.completions} called a tool, so the model must be shown a call once "
        "before GRPO can reward one. Then set model.init_from to the SFT checkpoint. "
        "(`--from-rollouts` does not take a config with tools, and would find no call to keep.)"
    ]
    if not t.info.lenient:
        if t.unparsed:
            advice.append(
                f"Lenient parsing, training.tool_call_lenient: true: {_outside(t)}; it runs "
                "them as calls, so GRPO can reward them, and tools/unparsed_frequency shows how "
                "many calls rely on it."
            )
        else:
            advice.append(
                "Lenient parsing (training.tool_call_lenient) would not help yet: no "
                f"completion wrote a call of {_tool_names(t)} outside the format either."
            )
    if t.info.replaced_tool_template:
        advice.append(
            f"model.chat_template: {t.info.chat_template} replaces the model's own chat "
            "template, which shows tools in the call format the model was trained on; "
            "`auto` (or no setting) keeps the model's own."
        )
    advice.append(_temperature_advice(m))
    g = m.settings.generations
    options = ", ".join(f"G={k}: {any_pass_probability(high, k):.0%}" for k in (g, 2 * g, 4 * g))
    advice.append(
        f"More generations: even at the interval's upper bound ({high:.1%}) a group holds a "
        f"call with probability at most {options} (training.num_generations)."
    )
    advice.append(_tool_system_prompt_advice(m, t))
    return Verdict("cold_start", reasons + warnings, advice)


def _side_warnings(m: Measurement) -> list[str]:
    """Warnings that hold whatever the status: truncation, parse failures, closed gates, tool
    calls outside the format."""
    out = []
    c, s, t = m.completions, m.settings, m.tools
    if t is not None and t.calling and t.unparsed:
        if t.info.lenient:
            out.append(f"{_outside(t)}: run only because training.tool_call_lenient is on")
        else:
            out.append(
                f"{_outside(t)}: not run; training.tool_call_lenient: true runs them "
                "(tools/unparsed_frequency counts them in training)"
            )
    if c.truncated_share >= TRUNCATION_WARNING:
        out.append(
            f"{c.truncated_share:.0%} of completions hit max_completion_length="
            f"{s.max_completion_length} without EOS (mean length {c.mean_length:.0f} tokens): "
            "an answer that ends with a closing tag cannot pass when cut; raise "
            "training.max_completion_length."
        )
    for r in m.rewards:
        if r.none_share >= 0.25:
            out.append(
                f"{r.name} returned None for {r.none_share:.0%} of samples (parse failures or "
                "'not applicable'); those samples carry no signal from it."
            )
        info = m.info(r.name)
        if info.gate and r.gated_out_share >= 1.0:
            out.append(
                f"{r.name} was never computed: its gate on {info.gate} stayed closed for every "
                "sample."
            )
    return out


def _no_signal(
    m: Measurement,
    flat: str,
    stuck: list[RewardStats],
    bounded: list[RewardStats],
    warnings: list[str],
) -> Verdict:
    """Every group is flat: a cold start, or saturation when everything already passes."""
    if bounded and not stuck and all(r.passed == r.applicable for r in bounded):
        reasons = [f"{flat}, and every sample reaches every reward's maximum"]
        reasons += [f"{r.name}: {_count(r)}" for r in bounded]
        advice = [
            "Use harder prompts or a stricter reward; GRPO only learns from groups whose "
            "rewards differ."
        ]
        return Verdict("saturated", reasons + warnings, advice)
    reasons = [f"{flat}: every batch gives zero advantage, so loss and gradient are 0"]
    reasons += [f"{r.name} {_count(r)} at its maximum ({_ci(r)}): cold start" for r in stuck]
    return Verdict("cold_start", reasons + warnings, _cold_start_advice(m, stuck))


def decide(m: Measurement) -> Verdict:
    """The verdict on one measurement (see the module docstring for statuses)."""
    zv = m.total_zero_variance_share
    g, p = m.settings.generations, m.settings.prompts
    stuck = _stuck(m)
    bounded = [r for r in m.rewards if r.passed is not None and r.applicable > 0]
    warnings = _side_warnings(m)
    flat = f"{zv:.0%} of the {p} groups of {g} have equal total rewards"

    if m.tools is not None and m.tools.calling == 0:  # the call is what must be learned first
        return _tool_cold_start(m, m.tools, warnings)

    if zv >= 1.0:
        return _no_signal(m, flat, stuck, bounded, warnings)

    reasons: list[str] = []
    advice: list[str] = []
    notes: list[str] = []
    low = False
    if zv >= LOW_SIGNAL_SHARE:
        low = True
        reasons.append(f"{flat}: that share of every batch gives no gradient")
        for r in bounded:
            rate = r.pass_rate
            if rate is not None and 0.0 < rate < 1.0:
                options = ", ".join(
                    f"G={k}: {mixed_group_probability(rate, k):.0%}" for k in (g, 2 * g, 4 * g)
                )
                advice.append(
                    f"More generations: at {r.name}'s pass rate {rate:.1%} a group holds both a "
                    f"pass and a fail with probability {options}."
                )
        advice.append(
            "training.dynamic_sampling: true drops flat groups and samples more prompts until "
            f"the batch is full (about {1 / max(1e-9, 1 - zv):.1f}x the generation at this share)."
        )
    if m.completions.distinct_share < COLLAPSED_DISTINCT:
        low = True
        ent = m.completions.entropy
        reasons.append(
            f"only {m.completions.distinct_share:.0%} of completions within a group are distinct"
            + (f" (entropy {ent:.2f} nats/token)" if ent is not None else "")
            + ": sampling has nearly collapsed, e.g. after a long SFT"
        )
        advice.append(_temperature_advice(m))
        advice.append("If this follows an SFT warm-start, warm-start with fewer steps.")
    for r in bounded:
        if r.passed == r.applicable:
            notes.append(
                f"{r.name} passes {_count(r)}: saturated, it adds a constant and teaches nothing."
            )
    for r in stuck:
        gate = m.info(r.name).gate
        notes.append(
            f"{r.name} passed {_count(r)} ({_ci(r)}): it gives no signal yet"
            + (f" (expected while {gate} is being learned)." if gate else ".")
        )
    signal = f"{1 - zv:.0%} of the {p} groups carry a learning signal" + "".join(
        f"; {r.name} {_count(r)} ({_ci(r)})" for r in bounded if r.passed and r.interval is not None
    )
    reasons.insert(0, signal)
    return Verdict("low_signal" if low else "go", reasons + warnings, advice, notes)
