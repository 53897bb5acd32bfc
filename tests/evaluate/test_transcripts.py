"""Transcripts in the views: `grpokit report`, `grpokit eval` (eval.md, the terminal, the report's
eval section) and `grpokit generate` show each model turn with its tool calls and the tool
results marked apart, and escape what a model or a tool wrote."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner
from rich.console import Console

from grpokit.cli import main
from grpokit.evaluate import transcripts
from grpokit.evaluate.eval import Sample, render_markdown, summarize_eval
from grpokit.evaluate.report import build_report
from grpokit.evaluate.tables import transcripts_html
from tests.rollout.tool_helpers import ScriptedEngine, hermes_call

HOSTILE = '</pre><script>console.error("pwned")</script><img src=x onerror=alert(1)> [red]x[/red]'
"""A tool result that would inject markup into an unescaped page or Rich console."""

MESSAGES: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": hermes_call("lookup", q="<b>bold</b>"),
        "tool_calls": [{"name": "lookup", "arguments": {"q": "<b>bold</b>"}}],
    },
    {"role": "tool", "name": "lookup", "content": HOSTILE, "error": False},
    {
        "role": "assistant",
        "content": "Retry.",
        "tool_calls": [{"name": "nothing", "arguments": {}}],
    },
    {"role": "tool", "name": "nothing", "content": '{"error": "unknown tool"}', "error": True},
    {"role": "assistant", "content": "The answer is 7."},
]


def test_text_view_marks_calls_results_and_errors_on_lines_of_their_own() -> None:
    text = transcripts.to_text(MESSAGES)
    assert text.splitlines() == [
        MESSAGES[0]["content"],
        '>> tool call: lookup({"q": "<b>bold</b>"})',
        f"<< tool result · lookup: {HOSTILE}",
        "Retry.",
        ">> tool call: nothing({})",
        '!! tool error · nothing: {"error": "unknown tool"}',
        "The answer is 7.",
    ]
    # Markdown: an indented block, in which nothing is rendered as markup.
    assert all(line.startswith("    ") for line in transcripts.to_markdown(MESSAGES).splitlines())
    cut = transcripts.to_text([{"role": "tool", "name": "t", "content": "y" * 50}], max_chars=10)
    assert cut == "<< tool result · t: " + "y" * 10 + "… [40 more characters]"


def test_html_view_styles_each_kind_apart_and_escapes_everything() -> None:
    page = transcripts.to_html(MESSAGES)
    assert page.count('class="msg turn"') == 3
    assert page.count('class="msg tool-call"') == 2
    assert page.count('class="msg tool-result"') == 1
    assert page.count('class="msg tool-error"') == 1
    assert "<script" not in page and "<img" not in page and "<b>" not in page
    assert "&lt;script&gt;console.error(&quot;pwned&quot;)&lt;/script&gt;" in page


def test_rich_view_escapes_markup_and_colours_the_markers() -> None:
    console = Console(record=True, width=200, color_system="truecolor", file=io.StringIO())
    console.print(transcripts.to_rich(MESSAGES))
    plain = console.export_text(clear=False)
    assert "[red]x[/red]" in plain  # shown, not applied
    assert "<< tool result · lookup:" in plain and "!! tool error · nothing:" in plain
    styled = console.export_html(inline_styles=True)
    assert "&lt;&lt; tool result · lookup:" in styled and "font-weight: bold" in styled


def test_report_samples_show_the_transcript(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.6}\n')
    rows = [
        {"step": s, "prompt": "What is 3 + 4?", "completion": "x", "reward": 1.0,
         "transcript": MESSAGES}
        for s in (1, 2)
    ]  # fmt: skip
    (run / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = build_report(run).read_text(encoding="utf-8")
    samples = html[html.index('<section id="samples">') :]
    assert samples.count('class="msg tool-result"') == 2  # early and late
    assert "<script>console" not in html and "<img src=x" not in html


def _sample(model: str, prompt: int, k: int, messages: list[dict[str, Any]] | None) -> Sample:
    return Sample(model, prompt, k, "text", 1.0, {"ok": 1.0}, 5, False, messages)


def test_eval_keeps_a_calling_transcript_per_model_and_prompt_and_shows_it() -> None:
    plain = [{"role": "assistant", "content": "I think 7."}]
    samples = [
        _sample("base", 0, 0, plain),
        _sample("base", 0, 1, MESSAGES),
        _sample("base", 1, 0, plain),
        _sample("base", 1, 1, plain),
    ]
    result = summarize_eval(
        samples, labels=["base"], paths={}, prompts=["What is 3 + 4?", "And 5 + 2?"],
        samples_per_prompt=2, reward_names=["ok"], thresholds={"ok": 1.0}, seed=0,
        sampling={}, heldout="h.jsonl",
    )  # fmt: skip
    assert [(t.prompt_index, t.sample) for t in result.transcripts] == [(0, 1), (1, 0)]
    text = render_markdown(result)
    assert "### Transcripts" in text and "base, prompt 0 (What is 3 + 4?), sample 1" in text
    assert f"    << tool result · lookup: {HOSTILE}" in text
    page = transcripts_html(result)
    assert page.count("tool-result") == 1 and "<script" not in page
    # Without tools there is nothing to show.
    bare = summarize_eval(
        [_sample("base", 0, 0, None)], labels=["base"], paths={}, prompts=["p"],
        samples_per_prompt=1, reward_names=["ok"], thresholds={}, seed=0, sampling={},
        heldout="h.jsonl",
    )  # fmt: skip
    assert bare.transcripts == [] and "Transcripts" not in render_markdown(bare)


TOOLS = f'''
def lookup(q: str) -> str:
    """Look a word up.

    Args:
        q: the word
    """
    return {HOSTILE!r}
'''
REWARD = """
def looked_up(prompts, completions, **columns):
    return [1.0 if any(m["role"] == "tool" for m in c) else 0.0 for c in completions]
"""


def reply(context: str, j: int) -> str:
    if context.rstrip().endswith("assistant") and "<|im_start|>tool" in context:
        return "It means nothing."
    return hermes_call("lookup", q="zorp") if j == 0 else "No idea."


@pytest.fixture
def tool_config(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """A config with a tool (whose result is hostile markup), and the models' token choice
    scripted: the first sample of each prompt calls the tool, the others answer directly."""
    torch.set_num_threads(1)
    (tmp_path / "my_tools.py").write_text(TOOLS)
    (tmp_path / "my_rewards.py").write_text(REWARD)
    prompts = tmp_path / "heldout.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": [{"role": "user", "content": f"What is zorp {i}?"}]}) + "\n"
                for i in range(2))
    )  # fmt: skip
    doc = {
        "model": {"name_or_path": str(tiny_model_dir), "chat_template": "hermes", "device": "cpu"},
        "data": {"train": "heldout.jsonl"},
        "rewards": [{"type": "python", "name": "looked_up", "function": "my_rewards.py:looked_up"}],
        "tools": ["my_tools.py:lookup"],
        "training": {"max_completion_length": 200, "report_to": ["none"]},
    }
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(
        "grpokit.sampling.sampler.torch_engine",
        lambda policy, cpu_matmul, **_: ScriptedEngine(policy.model, policy.tokenizer, reply),
    )
    return config, prompts


def _run_command(command: str, model: Path, setup: tuple[Path, Path], out: Path) -> str:
    """``grpokit COMMAND`` on the tool config's prompts, 2 samples each; its output."""
    config, prompts = setup
    cli = CliRunner().invoke(
        main,
        [command, "--model", f"base={model}", "--prompts", str(prompts), "--config", str(config),
         "--samples", "2", "--out", str(out)],
        env={"COLUMNS": "400"},
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    return cli.output


def test_eval_with_tools_writes_and_prints_marked_transcripts(
    tool_config: tuple[Path, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    output = _run_command("eval", tiny_model_dir, tool_config, out)
    assert ">> tool call: lookup" in output
    assert f"<< tool result · lookup: {HOSTILE}" in output
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert [r["rewards"]["looked_up"] for r in rows] == [1.0, 0.0, 1.0, 0.0]
    assert rows[0]["transcript"][1]["content"] == HOSTILE
    # The report's eval section shows the same transcripts, styled and escaped.
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.6}\n')
    html = build_report(run, eval_dir=out).read_text(encoding="utf-8")
    section = html[html.index('<section id="eval">') :]
    assert section.count('class="msg tool-call"') == 2 and "<script>console" not in html


def test_generate_with_the_configs_tools_shows_the_transcripts(
    tool_config: tuple[Path, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "samples.jsonl"
    output = _run_command("generate", tiny_model_dir, tool_config, out)
    assert output.count(">> tool call: lookup") == 2  # one calling sample per prompt
    assert "<< tool result · lookup:" in output and "[red]x[/red]" in output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r.get("transcript") or []) for r in records] == [3, 1, 3, 1]
    assert [r["rewards"]["looked_up"] for r in records] == [1.0, 0.0, 1.0, 0.0]
