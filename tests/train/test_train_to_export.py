"""What a run trained with is what its export serves: the chat template set by
``model.chat_template`` and the BOS the tokenizer adds travel from the trained checkpoint into the
HF directory and the GGUF file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from grpokit.config import GRPOKitConfig
from grpokit.data.chat import NAMED_TEMPLATES
from grpokit.files import current_umask
from grpokit.models.export import export_checkpoint
from grpokit.models.gguf_export import read_metadata
from grpokit.train.trainer import GRPOTrainer


@pytest.mark.parametrize("template", ["plain", "hermes"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_run_s_chat_template_is_the_export_s(
    make_config: Callable[..., GRPOKitConfig], tmp_path: Path, template: str, lora: bool
) -> None:
    model = {"chat_template": template, **({"lora": {"r": 4, "alpha": 8}} if lora else {})}
    cfg = make_config(model=model, max_steps=1, save_steps=1)
    GRPOTrainer(cfg, progress=False, log=lambda m: None).train()
    checkpoint = cfg.output_dir / "checkpoint-1"
    assert checkpoint.is_dir()
    want = NAMED_TEMPLATES[template]

    hf = export_checkpoint(str(checkpoint), fmt="hf", out=tmp_path / "hf", log=lambda m: None)
    assert hf.stat().st_mode & 0o777 == 0o777 & ~current_umask()  # not mkdtemp's 0700
    exported = AutoTokenizer.from_pretrained(hf)
    assert exported.chat_template == want
    messages = [{"role": "user", "content": "Hi"}]
    assert exported.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    gguf = export_checkpoint(
        str(checkpoint), fmt="gguf", out=tmp_path / "m.gguf", outtype="f32", log=lambda m: None
    )
    assert read_metadata(gguf)["tokenizer.chat_template"].value == want
