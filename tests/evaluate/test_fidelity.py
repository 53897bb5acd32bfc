"""`grpokit export --check`: the export's greedy answers against the checkpoint's, in the runtime
that serves it, and the warnings a user needs before serving it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.evaluate.fidelity import Answer, Fidelity, _warning, check_export
from grpokit.models.export import export_loaded, load_export_source
from tests.models.gguf_checks import perturbed_lora_checkpoint

PROMPTS = ["What is 17 + 25?", "Name three colours."]


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_factory: Callable[..., Path]
) -> Path:
    """A LoRA checkpoint on a tiny model whose greedy answers are not degenerate."""
    base = tiny_model_factory(seed=1, initializer_range=0.3)
    out = tmp_path_factory.mktemp("run") / "checkpoint-1" / "model"
    perturbed_lora_checkpoint(base, out)
    return out


@pytest.mark.parametrize(("fmt", "outtype"), [("hf", "float32"), ("gguf", "f32")])
def test_an_exact_export_answers_as_the_checkpoint(
    checkpoint: Path, tmp_path: Path, fmt: str, outtype: str
) -> None:
    out = tmp_path / ("hf" if fmt == "hf" else "m.gguf")
    loaded = load_export_source(
        str(checkpoint),
        fmt=fmt,
        out=out,
        outtype="f32",
        dtype="float32",  # type: ignore[arg-type]
    )
    path = export_loaded(loaded, fmt=fmt, out=out, outtype="f32", log=print)  # type: ignore[arg-type]
    result = check_export(loaded, path, fmt=fmt, outtype=outtype, prompts=PROMPTS, log=print)
    assert (result.identical, result.n) == (2, 2), result.answers
    assert all(a.same_prompt_tokens and a.checkpoint for a in result.answers)
    assert result.warning is None
    stored = (
        path.with_name(path.name + ".fidelity.json")
        if fmt == "gguf"
        else (path / "grpokit_fidelity.json")
    )
    assert json.loads(stored.read_text())["summary"] == result.summary
    assert result.summary.startswith("fidelity: 2 of 2 greedy completions identical")


def test_an_export_prompted_unlike_its_training_is_named(checkpoint: Path, tmp_path: Path) -> None:
    """An HF export whose chat template differs from the one the run used (the defect of
    exporting the base tokenizer) encodes prompts differently, and the check says so."""
    out = tmp_path / "hf"
    loaded = load_export_source(str(checkpoint), fmt="hf", out=out, outtype="f32", dtype="float32")
    path = export_loaded(loaded, fmt="hf", out=out, log=print)
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    )
    result = check_export(loaded, path, fmt="hf", outtype="float32", prompts=PROMPTS, log=print)
    assert not any(a.same_prompt_tokens for a in result.answers)
    assert result.identical == 0
    assert result.warning is not None and "prompted unlike it was trained" in result.warning


def _result(outtype: str, ckpt: float, export: float, identical: int) -> Fidelity:
    answer = Answer("q", "<answer>1</answer>", "1", True, identical == 4)
    return Fidelity("m.gguf", "llama.cpp", outtype, 48, identical, 4, [answer] * 4,
                    {"checkpoint": ckpt, "export": export})  # fmt: skip


def test_a_quantisation_that_loses_the_format_names_a_finer_type() -> None:
    warning = _warning(_result("q4_k_m", 1.0, 0.0, 0))
    assert warning is not None and "q4_k_m loses the trained format" in warning
    assert "--quantize q6_k" in warning
    changed = _warning(_result("q8_0", 1.0, 1.0, 3))
    assert changed is not None and "changes 1 of 4" in changed and "f16" in changed
    assert _warning(_result("f32", 1.0, 1.0, 4)) is None


def test_export_checks_by_default_and_check_0_skips(checkpoint: Path, tmp_path: Path) -> None:
    run = checkpoint.parent.parent
    result = CliRunner().invoke(
        main, ["export", str(run), "--format", "hf", "--out", str(tmp_path / "a")]
    )
    assert result.exit_code == 0, result.output
    assert "fidelity: 4 of 4 greedy completions identical" in result.output
    skipped = CliRunner().invoke(
        main, ["export", str(run), "--format", "hf", "--out", str(tmp_path / "b"), "--check", "0"]
    )
    assert skipped.exit_code == 0 and "fidelity" not in skipped.output
    assert not (tmp_path / "b" / "grpokit_fidelity.json").exists()
