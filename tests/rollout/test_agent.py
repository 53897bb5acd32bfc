"""The multi-turn tool loop, token by token: what the model sampled stays as sampled, tool
messages are appended as the chat template writes them and masked, only calling rows go on, and
the iteration limit and the completion budget end rows. The model's token choice is scripted
(:class:`ScriptedEngine`, :class:`ForcedTokens`); the loop, the masks and the tools are real."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpokit.data.chat import encode_prompt
from grpokit.errors import UserError
from grpokit.models.tiny import TOKENIZER_FAMILIES, make_tiny_model_dir, make_tiny_tokenizer_dir
from grpokit.rollout.agent import (
    ToolEngine,
    ToolMessageTokens,
    ToolRollout,
    check_tool_template,
    transcript,
    with_tools,
)
from grpokit.rollout.base import EngineCapabilities, SamplingParams
from grpokit.rollout.environments import Environments
from grpokit.rollout.tool_calls import parse_hermes, parse_llama3
from grpokit.rollout.tools import ToolCall, ToolResult, ToolRunner, load_tools
from grpokit.rollout.torch_engine import TorchEngine
from grpokit.train.step_metrics import tool_metrics

from .tool_helpers import (
    HERMES_TEMPLATE,
    LLAMA3_TEMPLATE,
    TOOLS_MODULE,
    ForcedTokens,
    ScriptedEngine,
    hermes_call,
    teacher_forced_logprobs,
)

TOOL_NAMES = ["calculator", "slow_add", "broken", "hang", "huge"]
CHATML_TOOL = "\n<|im_start|>tool\n<tool_response>{}</tool_response><|im_end|>"
CHATML_NEXT = "\n<|im_start|>assistant\n"


@pytest.fixture
def setup(tmp_path: Path, tiny_model_dir: Path) -> tuple[Any, Any, list[Any]]:
    (tmp_path / "my_tools.py").write_text(TOOLS_MODULE)
    tools = load_tools([f"my_tools.py:{n}" for n in TOOL_NAMES], tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = HERMES_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, tokenizer, tools


def _rollout(
    tokenizer: Any,
    tools: list[Any],
    *,
    parser: Callable[[str], Any] = parse_hermes,
    max_iterations: int | None = None,
    timeout: float = 5.0,
    cap: int = 2000,
) -> ToolRollout:
    schemas = [t.schema for t in tools]
    return ToolRollout(
        ToolRunner(tools, timeout=timeout, max_result_chars=cap),
        parser,
        ToolMessageTokens(tokenizer, schemas),
        max_iterations,
    )


def _ids(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def test_masks_token_by_token_and_only_calling_rows_go_on(setup: Any) -> None:
    model, tokenizer, tools = setup
    first = [
        hermes_call("calculator", a=6, b=7),
        "It is 42.",
        hermes_call("broken", x=1),
        hermes_call("calculator", a=6, b=7) + hermes_call("slow_add", a=1, b=2),
        hermes_call("hang", x=1),
    ]

    def reply(context: str, j: int) -> str:
        return "Done." if "<|im_start|>tool" in context else first[j]

    engine = ScriptedEngine(model, tokenizer, reply)
    # The hanging call's limit; also what the others must finish within on a loaded machine
    # (a thread each, one an event loop): 0.3 s was near what a busy 2-core machine can give.
    rollout = _rollout(tokenizer, tools, timeout=2.0)
    prompt = encode_prompt(tokenizer, "What is 6 times 7?", tools=rollout.schemas)
    params = SamplingParams(max_completion_length=200)
    out = rollout.generate(engine, [prompt], 5, params)

    eos = tokenizer.eos_token_id
    broke = json.dumps({"error": "RuntimeError: the tool broke"})
    hung = json.dumps({"error": "hang did not finish within 2 s"})
    tool_text = {0: ["42"], 2: [broke], 3: ["42", "3"], 4: [hung]}
    done = _ids(tokenizer, "Done.") + [eos]
    assert engine.calls[0][1:] == (5, 200)
    # Only the four rows that called a tool are sampled again, each from its own context.
    contexts, n, _ = engine.calls[1]
    assert len(engine.calls) == 2 and n == 1 and len(contexts) == 4
    for b in range(5):
        turn1 = _ids(tokenizer, first[b]) + [eos]
        ids, mask, logps = out.completion_ids[b], out.tool_mask, out.logprobs[b]
        if b == 1:  # answered without a call
            assert ids == turn1 and mask[b] == [1] * len(turn1)
            assert out.turns[b][0].calls == () and out.finish_reason[b] == "eos"
            continue
        suffix_text = "".join(CHATML_TOOL.format(t) for t in tool_text[b]) + CHATML_NEXT
        suffix = _ids(tokenizer, suffix_text)
        assert ids == turn1 + suffix + done
        assert mask[b] == [1] * len(turn1) + [0] * len(suffix) + [1] * len(done)
        assert contexts[[0, 2, 3, 4].index(b)] == prompt + turn1 + suffix
        # The sampler's log-probs at the model's tokens, 0 at the tool's.
        expected_first = teacher_forced_logprobs(model, prompt, turn1, 1.0)
        expected_second = teacher_forced_logprobs(model, prompt + turn1 + suffix, done, 1.0)
        torch.testing.assert_close(logps[: len(turn1)], expected_first)
        assert torch.all(logps[len(turn1) : len(turn1) + len(suffix)] == 0)
        torch.testing.assert_close(logps[len(turn1) + len(suffix) :], expected_second)
        t1, t2 = out.turns[b]
        assert (t1.start, t1.end, t1.tool_end) == (0, len(turn1), len(turn1) + len(suffix))
        assert (t2.start, t2.end) == (len(turn1) + len(suffix), len(ids))
        assert [c.content for c in t1.calls] == tool_text[b]
        assert out.finish_reason[b] == "eos"

    metrics = tool_metrics(out, TOOL_NAMES)
    assert metrics == {
        "tools/call_frequency": 5 / 5,
        "tools/failure_frequency": 2 / 5,
        "tools/unparsed_frequency": 0.0,
        "turns/mean": 9 / 5,
        "turns/max": 2.0,
        "tools/calculator/calls": 2.0,
        "tools/slow_add/calls": 1.0,
        "tools/broken/calls": 1.0,
        "tools/hang/calls": 1.0,
        "tools/huge/calls": 0.0,
    }
    messages = transcript(tokenizer, out.completion_ids[2], out.turns[2])
    assert messages == [
        {
            "role": "assistant",
            "content": first[2],
            "tool_calls": [{"name": "broken", "arguments": {"x": 1}}],
        },
        {"role": "tool", "name": "broken", "content": broke, "error": True},
        {"role": "assistant", "content": "Done."},
    ]


BARE = '{"name": "calculator", "arguments": {"a": 6, "b": 7}}'
FIRST_OUTSIDE = [BARE, f"```json\n{BARE}\n```", "It is 42.", '{"name": "search", "arguments": {}}']


@pytest.mark.parametrize("lenient", [False, True], ids=["strict", "lenient"])
def test_calls_outside_the_format_are_counted_and_run_only_when_lenient(
    setup: Any, lenient: bool
) -> None:
    """Qwen2.5-Coder's bare JSON and code-block calls: strict, they end the completion unrun
    but are counted (tools/unparsed_frequency); lenient, they run as calls and are still
    counted. A JSON object naming no tool of the run is neither."""
    model, tokenizer, tools = setup

    def reply(context: str, j: int) -> str:
        return "It is 42." if "<|im_start|>tool" in context else FIRST_OUTSIDE[j]

    engine = ScriptedEngine(model, tokenizer, reply)
    rollout = _rollout(tokenizer, tools)
    rollout.lenient = lenient
    prompt = encode_prompt(tokenizer, "What is 6 times 7?", tools=rollout.schemas)
    out = rollout.generate(engine, [prompt], 4, SamplingParams(max_completion_length=200))

    assert out.turns is not None
    assert [t[0].unparsed for t in out.turns] == [1, 1, 0, 0]
    metrics = tool_metrics(out, TOOL_NAMES)
    assert metrics["tools/unparsed_frequency"] == 2 / 4
    if lenient:
        for b in (0, 1):
            first, second = out.turns[b]
            assert [(c.name, c.content, c.failed) for c in first.calls] == [
                ("calculator", "42", False)
            ]
            assert tokenizer.decode(out.completion_ids[b][second.start :]).startswith("It is 42.")
        assert metrics["tools/call_frequency"] == 2 / 4 and len(engine.calls) == 2
    else:
        assert [len(t) for t in out.turns] == [1, 1, 1, 1]
        assert all(t[0].calls == () for t in out.turns)
        assert metrics["tools/call_frequency"] == 0.0 and len(engine.calls) == 1


def test_a_call_outside_the_format_after_the_last_round_is_counted(setup: Any) -> None:
    model, tokenizer, tools = setup

    def reply(context: str, j: int) -> str:
        return BARE if "<|im_start|>tool" in context else hermes_call("calculator", a=6, b=7)

    engine = ScriptedEngine(model, tokenizer, reply)
    rollout = _rollout(tokenizer, tools, max_iterations=1)
    prompt = encode_prompt(tokenizer, "What is 6 times 7?", tools=rollout.schemas)
    out = rollout.generate(engine, [prompt], 1, SamplingParams(max_completion_length=200))
    assert out.turns is not None
    assert [(len(t.calls), t.unparsed) for t in out.turns[0]] == [(1, 0), (0, 1)]


def test_iteration_limit_stops_a_model_that_keeps_calling(setup: Any) -> None:
    model, tokenizer, tools = setup
    engine = ScriptedEngine(model, tokenizer, lambda c, j: hermes_call("calculator", a=1, b=2))
    rollout = _rollout(tokenizer, tools, max_iterations=2)
    prompt = encode_prompt(tokenizer, "Go.", tools=rollout.schemas)
    out = rollout.generate(engine, [prompt], 2, SamplingParams(max_completion_length=500))
    for turns in out.turns or []:
        assert len(turns) == 3  # two rounds of calls ran; the third turn's call did not
        assert [len(t.calls) for t in turns] == [1, 1, 0]
    assert out.finish_reason == ["eos", "eos"]
    assert tool_metrics(out)["tools/call_frequency"] == 2.0


class _Counted(ScriptedEngine):
    """A scripted engine that counts the weight syncs and closes reaching it, and offers the
    reference rows and generating ahead (which a tool engine must not pass on)."""

    capabilities = EngineCapabilities(reference_logprobs=True, prefetch=True)
    syncs = closes = 0

    def sync_weights(self) -> None:
        self.syncs += 1

    def close(self) -> None:
        self.closes += 1


def test_a_tool_engine_is_the_loop_behind_the_engine_interface(setup: Any) -> None:
    model, tokenizer, tools = setup

    def reply(context: str, j: int) -> str:
        return "It is 42." if "<|im_start|>tool" in context else hermes_call("calculator", a=6, b=7)

    inner = _Counted(model, tokenizer, reply)
    rollout = _rollout(tokenizer, tools)
    engine = with_tools(inner, rollout)
    assert isinstance(engine, ToolEngine) and engine.tools is rollout
    assert with_tools(inner, None) is inner
    # None of the inner engine's offers: reference rows would cover the first turn only, and a
    # turn's prompt is not known before the last turn's calls have run.
    assert engine.capabilities == EngineCapabilities()
    prompt = encode_prompt(tokenizer, "What is 6 times 7?", tools=rollout.schemas)
    params = SamplingParams(max_completion_length=200)
    out = engine.generate([prompt], 2, params)
    direct = rollout.generate(ScriptedEngine(model, tokenizer, reply), [prompt], 2, params)
    assert out.completion_ids == direct.completion_ids and out.tool_mask == direct.tool_mask
    assert [len(t) for t in out.turns or []] == [2, 2]
    engine.sync_weights()
    engine.close()
    assert (inner.syncs, inner.closes) == (1, 1)
    with pytest.raises(NotImplementedError, match="runs no tools"):
        inner.with_environments([object()])
    envs = Environments(object, [], object())
    with_env = ToolRollout(rollout.runner, rollout.parser, rollout.messages, None, envs)
    with pytest.raises(ValueError, match="with_environments"):
        ToolEngine(inner, with_env).generate([prompt], 1, params)


def test_budget_rolls_back_a_result_that_overflows_and_cuts_a_long_turn(setup: Any) -> None:
    model, tokenizer, tools = setup
    first = [hermes_call("huge", x=1), hermes_call("calculator", a=2, b=3)]

    def reply(context: str, j: int) -> str:
        return "word " * 100 if "<|im_start|>tool" in context else first[j]

    engine = ScriptedEngine(model, tokenizer, reply)
    rollout = _rollout(tokenizer, tools, cap=500)
    prompt = encode_prompt(tokenizer, "Go.", tools=rollout.schemas)
    budget = 80
    out = rollout.generate(engine, [prompt], 2, SamplingParams(max_completion_length=budget))
    eos = tokenizer.eos_token_id
    # Row 0: 500 characters of result do not fit: run, not appended; the row ends truncated.
    turn1 = _ids(tokenizer, first[0]) + [eos]
    assert out.completion_ids[0] == turn1 and out.tool_mask is not None
    assert out.tool_mask[0] == [1] * len(turn1) and out.finish_reason[0] == "length"
    (only,) = out.turns[0] if out.turns else []
    assert only.tool_end == only.end and only.calls[0].content.startswith("y" * 500 + "... [cut")
    # Row 1: the answer after the tool is cut at the budget over all turns.
    assert len(out.completion_ids[1]) == budget and out.finish_reason[1] == "length"
    assert len(out.logprobs[1]) == budget == len(out.tool_mask[1])
    assert engine.calls[1][2] == budget - len(_ids(tokenizer, first[1])) - 1 - len(
        _ids(tokenizer, CHATML_TOOL.format("6") + CHATML_NEXT)
    )


FAMILY_CALLS = {
    "hermes": (HERMES_TEMPLATE, parse_hermes, hermes_call("calculator", a=6, b=7)),
    "llama3": (
        LLAMA3_TEMPLATE,
        parse_llama3,
        json.dumps({"name": "calculator", "parameters": {"a": 6, "b": 7}}),
    ),
}
FAMILY_SUFFIX = {
    "hermes": CHATML_TOOL.format("42") + CHATML_NEXT,
    "llama3": "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
}


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for family in TOKENIZER_FAMILIES:
        tok_dir = make_tiny_tokenizer_dir(tmp_path_factory.mktemp(f"tok-{family}"), family)
        out[family] = make_tiny_model_dir(
            tmp_path_factory.mktemp(f"m-{family}"), tokenizer_dir=tok_dir
        )
    return out


@pytest.mark.parametrize("family", TOKENIZER_FAMILIES)
def test_token_in_token_out_for_every_tokenizer_family(
    family: str, family_models: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "my_tools.py").write_text(TOOLS_MODULE)
    tools = load_tools(["my_tools.py:calculator"], tmp_path)
    kind = "llama3" if family == "llama3" else "hermes"
    template, parser, call = FAMILY_CALLS[kind]
    tokenizer = AutoTokenizer.from_pretrained(family_models[family])
    tokenizer.chat_template = template
    model = AutoModelForCausalLM.from_pretrained(family_models[family], dtype=torch.float32).eval()
    answer = " The product is 42, isn't it?"

    def reply(context: str, j: int) -> str:
        return (
            answer
            if context.rstrip().endswith(("assistant", "<|end_header_id|>")) and "42" in context
            else call
        )

    # Tokens of one character each: a re-rendering and re-tokenization would merge them.
    engine = ScriptedEngine(model, tokenizer, reply, by_character=True)
    rollout = _rollout(tokenizer, tools, parser=parser)
    prompt = encode_prompt(tokenizer, "What is 6 times 7?", tools=rollout.schemas)
    out = rollout.generate(engine, [prompt], 1, SamplingParams(max_completion_length=300))
    eos = tokenizer.eos_token_id
    turn1 = engine.encode(call) + [eos]
    assert turn1 != _ids(tokenizer, call) + [eos], "the test needs ids a re-tokenization changes"
    suffix = _ids(tokenizer, FAMILY_SUFFIX[kind])
    turn2 = engine.encode(answer) + [eos]
    ids = out.completion_ids[0]
    assert ids[: len(turn1)] == turn1  # turn 1's ids are never changed by turn 2
    assert ids == turn1 + suffix + turn2
    assert engine.calls[1][0] == [prompt + turn1 + suffix]  # the next input: ids concatenated
    assert out.tool_mask == [[1] * len(turn1) + [0] * len(suffix) + [1] * len(turn2)]


def test_real_engine_with_scripted_tokens(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch engine itself in the loop (prefill, left padding of contexts of different
    lengths, EOS handling), with only its token choice scripted."""
    model, tokenizer, tools = setup
    eos = tokenizer.eos_token_id
    call = _ids(tokenizer, hermes_call("calculator", a=3, b=4))
    answer = _ids(tokenizer, "12")
    forced = ForcedTokens([call, answer], eos)
    monkeypatch.setattr("grpokit.rollout.torch_engine.sample_next_tokens", forced)
    engine = forced.wrap(TorchEngine(model, eos_token_ids=[eos], pad_token_id=eos))
    rollout = _rollout(tokenizer, tools)
    prompts = [
        encode_prompt(tokenizer, q, tools=rollout.schemas) for q in ["3 times 4?", "Product?"]
    ]
    out = rollout.generate(engine, prompts, 2, SamplingParams(max_completion_length=100))
    suffix = _ids(tokenizer, CHATML_TOOL.format("12") + CHATML_NEXT)
    for b in range(4):
        assert out.completion_ids[b] == call + [eos] + suffix + answer + [eos]
        prompt = prompts[b // 2]
        model_part = torch.tensor(out.tool_mask[b]) == 1 if out.tool_mask else None
        assert model_part is not None and int(model_part.sum()) == len(call) + len(answer) + 2
        # The engine's log-probs of turn 2 are those of the context it was given.
        context = prompt + call + [eos] + suffix
        expected = teacher_forced_logprobs(model, context, answer + [eos], 1.0)
        torch.testing.assert_close(
            out.logprobs[b][-len(answer) - 1 :], expected, atol=1e-4, rtol=1e-4
        )
        assert torch.all(out.logprobs[b][~model_part] == 0)


# A template that, like Qwen3's, writes an empty think block into the last assistant turn only:
# the turn renders differently once a tool message follows it.
THINK_TEMPLATE = HERMES_TEMPLATE.replace(
    "{{ '<|im_start|>assistant\\n' + (m['content'] or '') }}",
    "{{ '<|im_start|>assistant\\n' }}{%- if loop.last %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{{ m['content'] }}",
)
# Shows the tools but drops tool messages.
NO_TOOL_ROLE = HERMES_TEMPLATE.replace(
    "{%- elif m['role'] == 'tool' %}", "{%- elif m['role'] == 'tool' %}{#"
)
NO_TOOL_ROLE = NO_TOOL_ROLE.replace(
    "</tool_response><|im_end|>\\n' }}", "</tool_response><|im_end|>\\n' }}#}"
)


def test_suffix_after_a_turn_the_template_renders_differently_later(setup: Any) -> None:
    _, tokenizer, tools = setup
    tokenizer.chat_template = THINK_TEMPLATE
    call = ToolCall("calculator", {"a": 6, "b": 7})
    result = ToolResult("calculator", "42", failed=False)
    messages = ToolMessageTokens(tokenizer, [t.schema for t in tools])
    assistant = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {}}}],
    }
    user = {"role": "user", "content": "x"}
    before = tokenizer.apply_chat_template([user, assistant], tokenize=False)
    after = tokenizer.apply_chat_template(
        [user, assistant, {"role": "tool", "content": "42"}], tokenize=False
    )
    assert not after.startswith(before)  # the case this test is about
    eos = tokenizer.eos_token_id
    assert messages.suffix_text(eos, [call], [result]) == CHATML_TOOL.format("42") + CHATML_NEXT
    check_tool_template(tokenizer, messages.tools, None, end_token=eos, where="model.chat_template")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "does not show `tools`"),
        (NO_TOOL_ROLE, "does not render 'tool' messages"),
    ],
    ids=["ignores-tools", "drops-tool-messages"],
)
def test_templates_without_tool_support_refused(setup: Any, template: str, message: str) -> None:
    _, tokenizer, tools = setup
    tokenizer.chat_template = template
    with pytest.raises(UserError, match=rf"model.chat_template: .*{message}"):
        check_tool_template(
            tokenizer,
            [t.schema for t in tools],
            None,
            end_token=tokenizer.eos_token_id,
            where="model.chat_template",
        )
