"""`grpokit export --check`: the export's greedy answers against the checkpoint's, in the runtime
that serves it, and the warnings a user needs before serving it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.evaluate.fidelity import NEAR_TIE, Answer, Fidelity, _compare, _warning, check_export
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
    # transformers against PyTorch: the same kernels, the same tokens. llama.cpp keeps its KV
    # cache in float16, which flips the near ties a random model has (one 0.0006 apart, seen).
    assert ((result.faithful if fmt == "gguf" else result.identical), result.n) == (2, 2), (
        result.answers
    )
    assert all(a.same_prompt_tokens and a.checkpoint for a in result.answers)
    assert result.warning is None
    stored = (
        path.with_name(path.name + ".fidelity.json")
        if fmt == "gguf"
        else (path / "grpokit_fidelity.json")
    )
    assert json.loads(stored.read_text())["summary"] == result.summary
    # The values: exact for transformers; llama.cpp's float16 KV cache moved this random
    # model's log-probs by up to 0.014 (seen), a real 0.5B's by 0.004.
    assert result.logprob_gap is not None
    assert result.logprob_gap < (1e-4 if fmt == "hf" else 0.05), result.answers


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


def _rows(*rows: dict[int, float], vocab: int = 5) -> torch.Tensor:
    """Logit rows over a 5-token vocabulary: each given token's logit, the others -10."""
    out = torch.full((len(rows), vocab), -10.0, dtype=torch.float64)
    for i, row in enumerate(rows):
        for token, value in row.items():
            out[i, token] = value
    return out


def _answer(
    mine: list[int], theirs: list[int], ours: torch.Tensor, exported: torch.Tensor
) -> Answer:
    return _compare("q", ([9, 8], [9, 8]), (mine, theirs), (ours, exported), str)


def test_a_parting_at_a_near_tie_is_told_from_a_changed_answer() -> None:
    """The checkpoint's logits at the first differing token decide: 1 and 2 within NEAR_TIE of
    each other there is a tie that rounding may flip; a clear preference for 1 is a change."""
    exported = _rows({1: 2.0}, {1: 1.0, 2: 1.001}, {3: 1.0})
    tie = _answer([1, 1], [1, 2, 3], _rows({1: 2.0}, {1: 1.001, 2: 1.0}, {3: 1.0}), exported)
    assert (tie.parts_at, tie.near_tie) == (1, True)
    assert tie.checkpoint_margin == pytest.approx(0.001)
    changed = _answer(
        [1, 1], [1, 2, 3], _rows({1: 2.0}, {1: 1.0 + 10 * NEAR_TIE, 2: 1.0}, {3: 1.0}), exported
    )
    assert (changed.parts_at, changed.near_tie) == (1, False)
    assert changed.checkpoint_margin == pytest.approx(10 * NEAR_TIE)
    # The checkpoint ended (its top token after the answer, 4, is an end token) where the export
    # went on with 2: the margin is between the end token and 2.
    ended = _answer([1], [1, 2], _rows({1: 2.0}, {4: 3.0, 2: 1.0}), _rows({1: 2.0}, {2: 3.0}))
    assert (ended.parts_at, ended.checkpoint_margin, ended.near_tie) == (1, 2.0, False)
    same = _answer([1, 1], [1, 1], _rows({1: 2.0}, {1: 1.0}, {3: 1.0}), exported)
    assert same.parts_at is None and not same.near_tie


def test_the_logprob_gap_is_over_the_checkpoints_own_tokens() -> None:
    """Teacher-forced on the checkpoint's answer [1, 3]: the gap is the largest |log p| difference
    of those tokens, not of others, and not of the row after the answer."""
    ours = _rows({1: 0.0, 2: 0.0}, {3: 0.0}, {4: 0.0})
    exported = _rows({1: 0.0, 2: 0.5}, {3: 0.0, 0: -9.0}, {0: 5.0})
    answer = _answer([1, 3], [2], ours, exported)
    lp = torch.log_softmax
    expected = max(
        abs(float(lp(ours[0], -1)[1] - lp(exported[0], -1)[1])),
        abs(float(lp(ours[1], -1)[3] - lp(exported[1], -1)[3])),
    )
    assert answer.logprob_gap == pytest.approx(expected) and expected > 0.2
    # Different prompt tokens: nothing to compare the values on.
    apart = _compare("q", ([9, 8], [7, 8]), ([1], [2]), (ours[:2], exported[:2]), str)
    assert apart.logprob_gap is None and apart.checkpoint_margin is None and not apart.near_tie


def test_a_quantisation_that_loses_the_format_names_a_finer_type() -> None:
    warning = _warning(_result("q4_k_m", 1.0, 0.0, 0))
    assert warning is not None and "q4_k_m loses the trained format" in warning
    assert "--quantize q6_k" in warning
    changed = _warning(_result("q8_0", 1.0, 1.0, 3))
    assert changed is not None and "changes 1 of 4" in changed and "f16" in changed
    assert _warning(_result("f32", 1.0, 1.0, 4)) is None
    # Parting only at a near tie is not a changed answer.
    tied = _result("q8_0", 1.0, 1.0, 3)
    tied.near_ties = 1
    assert _warning(tied) is None


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


def test_a_config_gives_the_check_its_prompts_and_format(
    checkpoint: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """An SFT output has no run config: --config names the one whose held-out prompts, system
    prompt and xml_format the check uses."""
    (tmp_path / "heldout.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Add {i} and {i + 1}."}) + "\n" for i in range(5))
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(tiny_model_dir)},
                "data": {"train": "heldout.jsonl", "heldout": "heldout.jsonl"},
                "rewards": [{"type": "xml_format", "tags": ["thinking", "answer"]}],
            }
        )
    )
    out = tmp_path / "hf"
    result = CliRunner().invoke(
        main,
        ["export", str(checkpoint), "--format", "hf", "--out", str(out), "--check", "3",
         "--config", str(config)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    stored = json.loads((out / "grpokit_fidelity.json").read_text())
    assert [a["prompt"] for a in stored["answers"]] == [
        "Add 0 and 1.",
        "Add 1 and 2.",
        "Add 2 and 3.",
    ]
    assert set(stored["format_rate"]) == {"checkpoint", "export"}
    assert "format kept in" in result.output
