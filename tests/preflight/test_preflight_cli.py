"""`grpokit preflight` on the tiny random model: cold start (exit 1) and go (exit 0); with tools,
the call rate, and a tool never called as a cold start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from rich.console import Console

from grpokit.cli import main
from grpokit.config import load_config
from grpokit.preflight import run as preflight_run
from grpokit.preflight.run import run_preflight
from tests.rollout.tool_helpers import TOOLS_MODULE, ScriptedEngine

PARITY = '''
def even_length(prompts, completions, **columns):
    """1 for completions with an even number of characters: about half of random texts."""
    return [1.0 if len(c) % 2 == 0 else 0.0 for c in completions]


def says_42(prompts, completions, **columns):
    """1 for a completion whose last words are the product the calculator gives."""
    return [1.0 if c.endswith("It is 42.") else 0.0 for c in completions]
'''


def _config(tmp_path: Path, model_dir: Path, rewards: list[dict[str, Any]]) -> Path:
    (tmp_path / "parity.py").write_text(PARITY)
    prompts = [{"prompt": f"What is {a} + {a}?", "answer": str(2 * a)} for a in range(10, 22)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    doc = {
        "model": {"name_or_path": str(model_dir)},
        "data": {"train": "train.jsonl", "system_prompt": "Answer as <answer>N</answer>."},
        "rewards": rewards,
        "training": {
            "num_generations": 4,
            "per_device_train_batch_size": 8,
            "max_completion_length": 6,
            "beta": 0.04,
            "output_dir": "run",
            "report_to": ["none"],
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_cold_start_exit_1(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        [
            {"type": "xml_format", "name": "format", "tags": ["answer"]},
            {
                "type": "math_answer",
                "name": "answer",
                "answer_column": "answer",
                "gate": {"reward": "format", "min": 1.0},
            },
        ],
    )
    result = CliRunner().invoke(main, ["preflight", str(cfg), "--prompts", "3"])
    assert result.exit_code == 1, result.output
    assert "COLD START" in result.output and "grpokit sft" in result.output
    doc = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert doc["schema"] == "grpokit.preflight/1"
    assert doc["verdict"]["status"] == "cold_start" and doc["verdict"]["exit_code"] == 1
    assert doc["settings"]["samples"] == 12 and doc["settings"]["generations"] == 4
    fmt = doc["rewards"]["format"]
    assert (fmt["passed"], fmt["applicable"]) == (0, 12)
    assert fmt["measured_pass_rate"] == 0.0 and fmt["forecast"] == 0.0
    assert fmt["pass_rate_interval"][1] > 0.2  # 0/12: the interval reaches 24%
    assert doc["rewards"]["answer"]["gated_out_share"] == 1.0
    assert doc["total"]["zero_variance_share"] == 1.0
    # Random tokens never end early at 6 tokens: truncation is reported.
    assert doc["completions"]["truncated_share"] == 1.0
    assert doc["partial_credit"][0]["type"] == "tags_present"


def test_go_exit_0_and_out_file(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        [{"type": "python", "name": "even", "function": "parity.py:even_length", "max_value": 1.0}],
    )
    out = tmp_path / "elsewhere" / "pf.json"
    result = CliRunner().invoke(
        main, ["preflight", str(cfg), "--prompts", "4", "--generations", "6", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "forecast" in result.output and "not a promise" in result.output
    doc = json.loads(out.read_text())
    even = doc["rewards"]["even"]
    assert 0 < even["passed"] < 24 and even["applicable"] == 24
    assert doc["verdict"]["status"] in ("go", "low_signal")
    assert doc["total"]["zero_variance_share"] < 1.0
    # beta 0.04 with std scaling: forecast above the measured rate.
    assert even["forecast"] > even["measured_pass_rate"]


def test_bad_checkpoint_is_a_user_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = _config(tmp_path, tiny_model_dir, [{"type": "xml_format", "tags": ["answer"]}])
    result = CliRunner().invoke(
        main, ["preflight", str(cfg), "--checkpoint", str(tmp_path / "nope")]
    )
    assert result.exit_code == 2
    assert "no such directory" in result.output


def _tool_config(
    tmp_path: Path, model_dir: Path, reward: str = "even_length", **training: Any
) -> Path:
    """A config with a calculator tool (grpokit's hermes template: the tiny model's SmolLM2
    template cannot show tools)."""
    path = _config(
        tmp_path,
        model_dir,
        [{"type": "python", "name": "r", "function": f"parity.py:{reward}", "max_value": 1.0}],
    )
    (tmp_path / "my_tools.py").write_text(TOOLS_MODULE)
    doc = yaml.safe_load(path.read_text())
    doc["tools"] = ["my_tools.py:calculator"]
    doc["model"]["chat_template"] = "hermes"
    doc["training"] |= {"max_completion_length": 200, **training}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_tool_never_called_is_a_cold_start(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The rewards vary (GO on them alone), but the random model never calls the tool."""
    cfg = _tool_config(tmp_path, tiny_model_dir, max_completion_length=6)
    result = CliRunner().invoke(main, ["preflight", str(cfg), "--prompts", "3"])
    assert result.exit_code == 1, result.output
    assert "COLD START" in result.output and "no completion called a tool" in result.output
    assert "tool calls: 0/12 completions called calculator (0.0%" in result.output
    assert "SFT warm-start on tool-call demonstrations" in result.output
    doc = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert doc["verdict"]["status"] == "cold_start" and doc["verdict"]["exit_code"] == 1
    tools = doc["tools"]
    assert (tools["names"], tools["format"], tools["lenient"]) == (["calculator"], "hermes", False)
    assert (tools["completions"], tools["calling"], tools["call_rate"]) == (12, 0, 0.0)
    low, high = tools["call_rate_interval"]
    assert low == pytest.approx(0.0, abs=1e-12) and high > 0.2  # 0/12: up to 24%


BARE = json.dumps({"name": "calculator", "arguments": {"a": 6, "b": 7}})


def _bare_or_tagged(tagged: int) -> Any:
    """Replies: the first ``tagged`` of each group call in <tool_call> tags, two write the call
    as bare JSON or in a json code block (as Qwen2.5-Coder did), the rest answer."""

    def reply(context: str, j: int) -> str:
        if "<|im_start|>tool" in context:
            return "It is 42."
        if j < tagged:
            return f"<tool_call>{BARE}</tool_call>"
        return {tagged: BARE, tagged + 1: f"```json\n{BARE}\n```"}.get(j, "It is 41.")

    return reply


@pytest.mark.parametrize(
    ("tagged", "lenient", "status", "rate"),
    [(0, False, "cold_start", "0/12"), (0, True, "go", "6/12"), (1, False, "go", "3/12")],
    ids=["strict", "lenient", "strict-with-tagged-calls"],
)
def test_the_call_rate_counts_calls_outside_the_format(
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    tagged: int,
    lenient: bool,
    status: str,
    rate: str,
) -> None:
    open_sampler = preflight_run.open_sampler

    def scripted(*args: Any, **kwargs: Any) -> Any:
        sampler, rows = open_sampler(*args, **kwargs)
        sampler.engine = ScriptedEngine(sampler.policy.model, sampler.tokenizer, reply)
        return sampler, rows

    reply = _bare_or_tagged(tagged)
    monkeypatch.setattr(preflight_run, "open_sampler", scripted)
    cfg = load_config(_tool_config(tmp_path, tiny_model_dir, "says_42", tool_call_lenient=lenient))
    console = Console(record=True, width=400)
    result = run_preflight(cfg, prompts=3, console=console)
    output = console.export_text()
    assert result.verdict.status == status, output
    tools = result.document["tools"]
    assert tools["lenient"] is lenient
    assert (tools["unparsed"], tools["unparsed_calls"]) == (6, 6)  # 2 of each group of 4
    assert f"tool calls: {rate} completions called calculator" in output
    assert "6 wrote 6 call(s) outside the hermes format" in output
    text = "\n".join(result.verdict.reasons + result.verdict.advice)
    if status == "cold_start":
        assert "training.tool_call_lenient: true: 6/12 completions wrote 6 call(s)" in text
    elif lenient:
        assert "run only because training.tool_call_lenient is on" in text
    else:
        assert "not run; training.tool_call_lenient: true runs them" in text
