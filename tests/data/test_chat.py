"""A model without a chat template is refused with the setting that fixes it, never guessed at."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.data.chat import (
    HERMES_TEMPLATE,
    PLAIN_TEMPLATE,
    apply_template_setting,
    encode_prompt,
    shows_tools,
)
from grpokit.errors import UserError
from tests.rollout.tool_helpers import LLAMA3_TEMPLATE, QWEN25_TEMPLATE


@pytest.fixture
def base_model_dir(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """The tiny model with its tokenizer's chat template taken away (a base model)."""
    out = tmp_path / "base-model"
    shutil.copytree(tiny_model_dir, out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


def _train(tmp_path: Path, model_dir: Path, **model: str) -> tuple[int, str]:
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "Say hi."}) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(model_dir), **model},
                "data": {"train": "p.jsonl", "system_prompt": "Be brief."},
                "rewards": [{"type": "xml_format"}],
                "training": {
                    "num_generations": 2,
                    "per_device_train_batch_size": 2,
                    "max_completion_length": 4,
                    "max_steps": 1,
                    "report_to": "none",
                    "output_dir": "run",
                },
            }
        )
    )
    result = CliRunner().invoke(main, ["train", str(config), "--no-progress"])
    return result.exit_code, result.output


def test_a_model_without_a_template_names_the_setting(tmp_path: Path, base_model_dir: Path) -> None:
    code, output = _train(tmp_path, base_model_dir)
    assert code == 2, output
    assert "has no chat template" in output and "model.chat_template" in output
    assert "'plain'" in output


def test_plain_joins_the_messages_and_trains(tmp_path: Path, base_model_dir: Path) -> None:
    code, output = _train(tmp_path, base_model_dir, chat_template="plain")
    assert code == 0, output


def test_a_template_from_a_file_or_inline(tmp_path: Path, tiny_tokenizer: object) -> None:
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    apply_template_setting(tiny_tokenizer, "t.jinja", tmp_path)
    ids = encode_prompt(tiny_tokenizer, "hi", system_prompt="sys")
    assert tiny_tokenizer.decode(ids) == "[sys][hi]"  # type: ignore[attr-defined]
    apply_template_setting(tiny_tokenizer, "plain", tmp_path)
    assert tiny_tokenizer.chat_template == PLAIN_TEMPLATE  # type: ignore[attr-defined]
    assert tiny_tokenizer.decode(encode_prompt(tiny_tokenizer, "hi", system_prompt="sys")) == "sys\n\nhi"  # type: ignore[attr-defined]  # fmt: skip
    with pytest.raises(UserError, match="model.chat_template: .*missing.jinja does not exist"):
        apply_template_setting(tiny_tokenizer, "missing.jinja", tmp_path)


def test_a_bos_the_tokenizer_adds_is_kept_once_as_servers_keep_it(tmp_path: Path) -> None:
    """Gemma's tokenizer puts a BOS before any text; llama.cpp and transformers' tokenizer(text)
    keep it, so grpokit must too, without doubling the one a template writes."""
    from transformers import AutoTokenizer

    from grpokit.data.chat import bos_prefix
    from grpokit.models.tiny import make_tiny_sentencepiece_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(make_tiny_sentencepiece_tokenizer_dir(tmp_path, "gemma"))
    bos = tok.bos_token_id
    assert bos_prefix(tok) == [bos]
    served = tok("What is 47 + 38?")["input_ids"]  # what a server feeds for the plain text
    tok.chat_template = PLAIN_TEMPLATE
    ids = encode_prompt(tok, "What is 47 + 38?")
    assert ids == served and ids[0] == bos and ids.count(bos) == 1
    # Gemma's own template writes {{ bos_token }}: not doubled.
    with_template = AutoTokenizer.from_pretrained(tmp_path)
    ids = encode_prompt(with_template, "Hi")
    assert ids[0] == bos and ids.count(bos) == 1
    # Cut from the left to max_prompt_length, the BOS stays first.
    long = "one two three four five six seven"
    cut = encode_prompt(tok, long, max_prompt_length=4)
    assert cut == [bos, *tok(long, add_special_tokens=False)["input_ids"][-3:]]


def test_a_tokenizer_that_adds_no_bos_gets_none(tiny_model_dir: Path) -> None:
    """SmolLM2 and Qwen add no BOS: their prompts are exactly the template's text."""
    from transformers import AutoTokenizer

    from grpokit.data.chat import bos_prefix, render_prompt

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert bos_prefix(tok) == []
    text = render_prompt(tok, "Hi")
    assert encode_prompt(tok, "Hi") == tok(text, add_special_tokens=False)["input_ids"]


LLAMA2_CHAT = (  # no tools, not ChatML: auto leaves it for the tool check to refuse by name
    "{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }}{% endif %}{% endfor %}"
)


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        (QWEN25_TEMPLATE, QWEN25_TEMPLATE),  # Qwen2.5's own shows tools: kept
        (LLAMA3_TEMPLATE, LLAMA3_TEMPLATE),
        (None, HERMES_TEMPLATE),  # the tiny model's own: SmolLM2's ChatML, without tools
        (LLAMA2_CHAT, LLAMA2_CHAT),
    ],
    ids=["qwen2.5", "llama3", "smollm2", "llama2"],
)
def test_auto_keeps_a_models_own_tool_template(
    tmp_path: Path, tiny_tokenizer: Any, own: str | None, expected: str
) -> None:
    if own is not None:
        tiny_tokenizer.chat_template = own
    apply_template_setting(tiny_tokenizer, "auto", tmp_path)
    assert tiny_tokenizer.chat_template == expected
    assert shows_tools(tiny_tokenizer) == (expected != LLAMA2_CHAT)
    tiny_tokenizer.chat_template = None
    apply_template_setting(tiny_tokenizer, "auto", tmp_path)  # none of its own: left without
    assert tiny_tokenizer.chat_template is None
