"""SFT on tool-using demonstrations: the completion is laid out token by token as a multi-turn
rollout lays it out, the tool messages' tokens are masked out of the loss, bad conversations are
refused with the file and line, and the tool task's data is deterministic and disjoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpokit.config import GRPOKitConfig
from grpokit.data.chat import encode_prompt
from grpokit.data.tasks import (
    calculator_demonstration,
    fresh_multiplication_problems,
    multiplication_sets,
    write_multiplication_task,
)
from grpokit.errors import UserError
from grpokit.recipes import RECIPES_DIR
from grpokit.rollout.agent import ToolMessageTokens, ToolRollout
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.tool_calls import parse_hermes
from grpokit.rollout.tools import ToolRunner, load_tools
from grpokit.train.forward import completion_logprobs, pack
from grpokit.train.sft import completion_tokens, load_demonstrations, run_sft
from grpokit.train.sft_run import run_sft_from_config
from tests.rollout.tool_helpers import HERMES_TEMPLATE, TOOLS_MODULE, ScriptedEngine

RECIPE = RECIPES_DIR / "tool-arithmetic"


@pytest.fixture
def hermes(tmp_path: Path, tiny_model_dir: Path) -> tuple[Any, Any, list[dict[str, Any]]]:
    (tmp_path / "my_tools.py").write_text(TOOLS_MODULE)
    tools = load_tools([f"{RECIPE / 'calculator.py'}:calculator"], tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = HERMES_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, tokenizer, [t.schema for t in tools]


def test_a_tool_demonstration_is_laid_out_as_the_rollout_lays_it_out(
    hermes: Any, tmp_path: Path
) -> None:
    model, tokenizer, schemas = hermes
    demo = calculator_demonstration(347, 86)
    ids, mask = completion_tokens(tokenizer, demo["completion"], tools=schemas)  # type: ignore[arg-type]

    # The same conversation sampled by the rollout loop with the real calculator.
    call = json.dumps({"name": "calculator", "arguments": {"expression": "347 * 86"}})

    def reply(context: str, j: int) -> str:
        return (
            "<answer>29842</answer>"
            if "<|im_start|>tool" in context
            else f"<tool_call>{call}</tool_call>"
        )

    tools = load_tools([f"{RECIPE / 'calculator.py'}:calculator"], tmp_path)
    rollout = ToolRollout(
        ToolRunner(tools, timeout=5.0, max_result_chars=100),
        parse_hermes,
        ToolMessageTokens(tokenizer, schemas),
        2,
    )
    prompt = encode_prompt(tokenizer, demo["prompt"], tools=schemas)
    out = rollout.generate(
        ScriptedEngine(model, tokenizer, reply),
        [prompt],
        1,
        SamplingParams(max_completion_length=200),
    )
    assert ids == out.completion_ids[0]
    assert out.tool_mask is not None and mask == out.tool_mask[0]

    # Token by token: the call and its EOS, then the tool message (masked), then the answer.
    eos = tokenizer.eos_token_id
    call_ids = tokenizer(f"<tool_call>{call}</tool_call>", add_special_tokens=False)["input_ids"]
    suffix = tokenizer(
        "\n<|im_start|>tool\n<tool_response>29842</tool_response><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )["input_ids"]
    answer = tokenizer("<answer>29842</answer>", add_special_tokens=False)["input_ids"]
    assert ids == [*call_ids, eos, *suffix, *answer, eos]
    assert mask == [1] * (len(call_ids) + 1) + [0] * len(suffix) + [1] * (len(answer) + 1)
    # A string completion: its tokens and EOS, all trained on.
    plain, plain_mask = completion_tokens(tokenizer, "<answer>3</answer>")
    assert plain[-1] == eos and plain_mask == [1] * len(plain)


def test_sft_loss_leaves_the_tool_messages_out(hermes: Any) -> None:
    model, tokenizer, schemas = hermes
    demos_rows = [calculator_demonstration(a, b) for a, b in [(347, 86), (120, 11), (999, 99)]]
    from grpokit.train.sft import Demonstration

    demos = [Demonstration(d["prompt"], d["completion"]) for d in demos_rows]  # type: ignore[arg-type]
    prompts = [encode_prompt(tokenizer, d.prompt, tools=schemas) for d in demos]
    encoded = [completion_tokens(tokenizer, d.completion, tools=schemas) for d in demos]
    with torch.no_grad():
        batch = pack(prompts, [i for i, _ in encoded], tokenizer.pad_token_id)
        logp, _ = completion_logprobs(model, batch)
    trained = torch.zeros_like(logp)
    for row, (_, m) in enumerate(encoded):
        trained[row, : len(m)] = torch.tensor(m, dtype=torch.float32)
    expected = float(-(logp * trained).sum() / trained.sum())
    everything = float(-(logp * batch.completion_mask).sum() / batch.completion_mask.sum())
    assert abs(expected - everything) > 1e-3  # the tool tokens would change the loss
    history = run_sft(
        model,
        tokenizer,
        demos,
        [p for p in model.parameters()],
        system_prompt=None,
        max_steps=1,
        batch_size=3,
        learning_rate=0.0,
        tools=schemas,
        log=lambda m: None,
    )
    assert history[0]["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    ("completion", "message"),
    [
        (
            [
                {"role": "assistant", "content": "hi", "tool_calls": []},
                {"role": "tool", "content": "x"},
            ],
            "must answer a call",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
                }
            ],
            "the last message must be an assistant turn",
        ),
        ([{"role": "user", "content": "hi"}], "role 'assistant' or 'tool'"),
        (
            [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"arguments": {}}}],
                },
                {"role": "tool", "content": "1"},
                {"role": "assistant", "content": "a"},
            ],
            'needs a "name"',
        ),
        ([], "the last message must be an assistant turn"),
    ],
)
def test_bad_tool_conversations_are_refused(
    tmp_path: Path, completion: list[Any], message: str
) -> None:
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps({"prompt": "p", "completion": completion}) + "\n")
    with pytest.raises(UserError, match=rf"demos.jsonl:1: 'completion': .*{message}"):
        load_demonstrations(path)


def test_from_rollouts_with_tools_is_refused(
    tmp_path: Path, make_config: Callable[..., GRPOKitConfig]
) -> None:
    (tmp_path / "my_tools.py").write_text(TOOLS_MODULE)
    cfg = make_config(model={"chat_template": "hermes"})
    cfg = cfg.model_copy(update={"tools": ["my_tools.py:calculator"]})
    with pytest.raises(UserError, match="--from-rollouts: the config has tools"):
        run_sft_from_config(cfg, output=tmp_path / "sft", from_rollouts=True, log=lambda m: None)


def test_tool_task_data_is_deterministic_disjoint_and_shipped(tmp_path: Path) -> None:
    sets = multiplication_sets()
    assert sets == multiplication_sets()
    train, heldout, demos = (set(sets[k]) for k in ("train", "heldout", "demos"))
    assert not train & heldout and not demos & (train | heldout)
    assert all(100 <= a <= 999 and 10 <= b <= 99 for a, b in train | heldout | demos)
    fresh = fresh_multiplication_problems(200)
    assert len(set(fresh)) == 200 and not set(fresh) & (train | heldout | demos)
    assert fresh == fresh_multiplication_problems(200)
    # The recipe's files are what the generator writes.
    for name, path in write_multiplication_task(tmp_path).items():
        assert path.read_text() == (RECIPE / f"{name}.jsonl").read_text(), name
    demo = load_demonstrations(RECIPE / "demos.jsonl")[0]
    assert isinstance(demo.completion, list) and demo.completion[1]["role"] == "tool"


def test_the_recipe_calculator_does_arithmetic_only(tmp_path: Path) -> None:
    (tool,) = load_tools([f"{RECIPE / 'calculator.py'}:calculator"], tmp_path)
    calculator = tool.function
    assert calculator("347 * 86") == "29842"
    assert calculator("(1 + 2) / 3") == "1" and calculator("7 / 2") == "3.5"
    assert calculator(" -4 * 25 ") == "-100"
    for bad in ["__import__('os')", "2 ** 10", "True + 1", "x * 2", "1 +"]:
        with pytest.raises(ValueError):
            calculator(bad)
    with pytest.raises(ValueError, match="more than 30 digits"):
        calculator("99999999999999999 * 99999999999999999")
    assert tool.schema["function"]["parameters"]["required"] == ["expression"]
