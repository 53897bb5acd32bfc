"""`grpokit export`: HF directories reproduce the checkpoint's logits; GGUF files run in llama.cpp
with PyTorch's logits (within float32 or float16 rounding) and greedy tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.errors import UserError
from grpokit.hub.embedded import MARKER_FILE, find_embedded_gguf
from grpokit.models.export import export_checkpoint, origin_gguf
from grpokit.models.gguf_export import (
    arch_spec,
    read_metadata,
    rotate_pairs_layout,
    tokenizer_metadata,
)
from grpokit.models.loading import Policy, load_policy
from grpokit.models.tiny import TINY_CONFIG

from .gguf_checks import (
    assert_close_logits,
    chat_ids,
    llama_greedy,
    llama_logits,
    open_llama,
    perturbed_lora_checkpoint,
    tiny_of,
    torch_greedy,
)

PROMPTS = [
    "What is 17 + 25?",
    "Write one sentence about rivers.",
    "Name three colours.",
]
GREEDY_TOKENS = 16


# ---- helpers -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_factory: Callable[..., Path]
             ) -> Iterator[tuple[Path, Policy]]:  # fmt: skip
    """A run-like directory with checkpoint-1/model holding a LoRA adapter on a tiny model whose
    greedy output is not degenerate."""
    torch.set_num_threads(1)
    base = tiny_model_factory(seed=1, initializer_range=0.3)
    run = tmp_path_factory.mktemp("run")
    policy = perturbed_lora_checkpoint(base, run / "checkpoint-1" / "model")
    yield run, policy


# ---- the RoPE layout (pure) --------------------------------------------------------------------


def test_rotate_pairs_layout_turns_half_rotation_into_pair_rotation() -> None:
    """Rotating halves (transformers) then reordering equals reordering then rotating adjacent
    pairs (llama.cpp): the reorder is what makes llama.cpp's attention scores equal ours."""
    heads, d = 3, 8
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(heads * d, generator=gen, dtype=torch.float64)
    angles = torch.rand(d // 2, generator=gen, dtype=torch.float64) * 3
    cos, sin = torch.cos(angles), torch.sin(angles)

    def rotate_half_rope(v: torch.Tensor) -> torch.Tensor:
        v = v.reshape(heads, d)
        a, b = v[:, : d // 2], v[:, d // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).reshape(-1)

    def rotate_pairs_rope(v: torch.Tensor) -> torch.Tensor:
        v = v.reshape(heads, d // 2, 2)
        a, b = v[..., 0], v[..., 1]
        return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).reshape(-1)

    expected = rotate_pairs_layout(rotate_half_rope(q), heads)
    assert torch.allclose(rotate_pairs_rope(rotate_pairs_layout(q, heads)), expected)
    # A weight matrix: the same row order for every column.
    w = torch.arange(heads * d * 2, dtype=torch.float32).reshape(heads * d, 2)
    assert torch.equal(rotate_pairs_layout(w, heads)[:, 0], rotate_pairs_layout(w[:, 0], heads))
    assert rotate_pairs_layout(w, heads)[:4, 0].tolist() == [0.0, 8.0, 2.0, 10.0]


# ---- hf ----------------------------------------------------------------------------------------

_LOAD_WITHOUT_GRPOKIT = """
import sys, json, torch
sys.modules["grpokit"] = None  # any import of grpokit now fails
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                              tokenize=True, return_dict=True)["input_ids"]
with torch.no_grad():
    logits = model(input_ids=torch.tensor([ids])).logits[0]
json.dump({"ids": list(ids), "logits": logits.tolist()}, open(sys.argv[2], "w"))
"""


def test_export_hf_reproduces_checkpoint_logits_without_grpokit(
    lora_run: tuple[Path, Policy], tmp_path: Path
) -> None:
    run, policy = lora_run
    out = export_checkpoint(str(run / "checkpoint-1"), fmt="hf", out=tmp_path / "hf", log=print)
    assert not (out / "adapter_config.json").exists()  # merged, not an adapter
    assert (out / "config.json").is_file()

    result = tmp_path / "logits.json"
    subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_GRPOKIT, str(out), str(result)],
        check=True,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )
    data = json.loads(result.read_text())
    ids = data["ids"]
    assert ids == chat_ids(policy.tokenizer, "Hi")  # chat template travelled with the model
    with torch.no_grad():
        expected = policy.model(input_ids=torch.tensor([ids])).logits[0]
    exported = torch.tensor(data["logits"])
    assert exported.shape == expected.shape
    assert torch.allclose(exported, expected, atol=1e-4, rtol=1e-4)
    # The adapter really changes the model: the export is not just the base.
    peft_model: Any = policy.model
    with torch.no_grad(), peft_model.disable_adapter():
        base = peft_model(input_ids=torch.tensor([ids])).logits[0]
    assert (base - expected).abs().max() > 1e-2


# ---- gguf --------------------------------------------------------------------------------------


def test_gguf_f32_runs_in_llama_cpp_with_the_same_logits_and_greedy_tokens(
    lora_run: tuple[Path, Policy], tmp_path: Path
) -> None:
    run, policy = lora_run
    result = CliRunner().invoke(
        main, ["export", str(run), "--format", "gguf", "--outtype", "f32", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    # Named after the run's latest checkpoint.
    (path,) = tmp_path.glob("*.gguf")
    assert path.name == f"{run.name}-checkpoint-1-f32.gguf"
    llm = open_llama(path)
    try:
        assert llm.n_vocab == len(policy.tokenizer)
        for text in PROMPTS:
            ids = chat_ids(policy.tokenizer, text)
            # llama.cpp reads the tokenizer from the file: it must split text as transformers does.
            rendered = str(policy.tokenizer.decode(ids))
            assert llm.tokenize(rendered, add_bos=False, special=True) == ids
            expected = torch_greedy(policy.model, ids, GREEDY_TOKENS)
            assert len(set(expected)) > 3, "degenerate reference continuation"
            assert_close_logits(llm, policy.model, ids + expected)
            assert llama_greedy(llm, ids, GREEDY_TOKENS) == expected
    finally:
        llm.close()


def test_gguf_f16_and_q8_0_stay_close_to_pytorch(
    lora_run: tuple[Path, Policy], tmp_path: Path
) -> None:
    """f32 and f16 within the logit tolerances of gguf_checks at every position; q8_0 within 15%
    of the largest logit at the last one."""
    run, policy = lora_run
    ids = chat_ids(policy.tokenizer, PROMPTS[0])
    with torch.no_grad():
        expected = policy.model(input_ids=torch.tensor([ids])).logits[0, -1]
    sizes = {}
    for outtype in ("f32", "f16", "q8_0"):
        path = export_checkpoint(
            str(run / "checkpoint-1"),
            fmt="gguf",
            out=tmp_path / f"m-{outtype}.gguf",
            outtype=outtype,  # type: ignore[arg-type]
            log=print,
        )
        sizes[outtype] = path.stat().st_size
        meta = read_metadata(path)
        assert meta["general.file_type"].value == {"f32": 0, "f16": 1, "q8_0": 7}[outtype]
        llm = open_llama(path)
        try:
            if outtype != "q8_0":
                assert_close_logits(llm, policy.model, ids, outtype)
            got = llama_logits(llm, ids)[-1]
        finally:
            llm.close()
        if outtype == "q8_0":
            error = float((got - expected).abs().max() / expected.abs().max())
            assert error < 0.15, error
        if outtype == "f32":
            assert int(got.argmax()) == int(expected.argmax())
        else:
            # Rounded weights may swap near-tied logits of a random model: PyTorch's top token
            # must stay among the exported model's top 5.
            assert int(expected.argmax()) in got.topk(5).indices.tolist(), outtype
    assert sizes["q8_0"] < sizes["f16"] < sizes["f32"]


def test_gguf_metadata_reuses_the_known_tokenizer_and_the_source_file(
    tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    """A model whose base records the GGUF it came from gets that file's general.* metadata; the
    tokenizer metadata is the source file's (with llama.cpp's pre-tokenizer name)."""
    import shutil

    base = tmp_path / "converted"
    shutil.copytree(tiny_model_factory(seed=1, initializer_range=0.3), base)
    source = find_embedded_gguf()
    (base / MARKER_FILE).write_text(json.dumps({"format": 1, "gguf_path": str(source)}))
    perturbed_lora_checkpoint(base, tmp_path / "adapter")
    assert origin_gguf(str(base), str(tmp_path / "adapter")) == source

    path = export_checkpoint(
        str(tmp_path / "adapter"), fmt="gguf", out=tmp_path / "out.gguf", outtype="f32", log=print
    )
    meta, original = read_metadata(path), read_metadata(source)
    for key in ("general.name", "general.license", "general.organization", "tokenizer.ggml.pre",
                "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"):  # fmt: skip
        assert meta[key].value == original[key].value, key
    assert meta["llama.block_count"].value == TINY_CONFIG["num_hidden_layers"]
    assert meta["llama.embedding_length"].value == TINY_CONFIG["hidden_size"]
    assert meta["llama.attention.head_count_kv"].value == TINY_CONFIG["num_key_value_heads"]


def test_tokenizer_metadata_from_tokenizer_json_matches_llama_cpp_s_converter(
    tiny_tokenizer: Any,
) -> None:
    """Built from tokenizer.json, the vocabulary, token types, merges and special ids equal those
    that llama.cpp's own converter wrote into the embedded model's GGUF."""
    ours = {kv.key: kv.value for kv in tokenizer_metadata(tiny_tokenizer, len(tiny_tokenizer))}
    theirs = read_metadata(find_embedded_gguf())
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"):  # fmt: skip
        assert ours[key] == theirs[key].value, key
    # More embedding rows than tokens: placeholders, marked unused, keep one token per row.
    padded = {
        kv.key: kv.value for kv in tokenizer_metadata(tiny_tokenizer, len(tiny_tokenizer) + 2)
    }
    assert padded["tokenizer.ggml.tokens"][-2:] == [
        f"[PAD{len(tiny_tokenizer)}]",
        f"[PAD{len(tiny_tokenizer) + 1}]",
    ]
    assert padded["tokenizer.ggml.token_type"][-1] == 5


@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_gguf_other_architectures_match_logits_and_greedy(
    kind: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tiny_of(kind, tiny_model_dir, tmp_path / kind)
    path = export_checkpoint(
        str(model_dir), fmt="gguf", out=tmp_path / "m.gguf", outtype="f32", log=print
    )
    assert (
        read_metadata(path)["general.architecture"].value
        == arch_spec(AutoModelForCausalLM.from_pretrained(model_dir).config).gguf_arch
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = chat_ids(tokenizer, PROMPTS[1])
    llm = open_llama(path)
    try:
        greedy = torch_greedy(model, ids, GREEDY_TOKENS)
        assert_close_logits(llm, model, ids + greedy)
        assert llama_greedy(llm, ids, GREEDY_TOKENS) == greedy
    finally:
        llm.close()


def test_unmapped_architecture_is_a_user_error_naming_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer, GPTNeoXConfig, GPTNeoXForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = GPTNeoXConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, vocab_size=len(tokenizer))  # fmt: skip
    GPTNeoXForCausalLM(config).save_pretrained(tmp_path / "neox")
    tokenizer.save_pretrained(tmp_path / "neox")
    result = CliRunner().invoke(
        main,
        ["export", str(tmp_path / "neox"), "--format", "gguf", "--out", str(tmp_path / "x.gguf")],
    )
    assert result.exit_code == 2
    assert "GPTNeoXForCausalLM" in result.output and "--format hf" in result.output
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
def test_a_wrong_checkpoint_is_named_as_export_calls_it(fmt: str, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "empty").mkdir()
    for given in (tmp_path / "missing", tmp_path / "notes.txt", tmp_path / "empty"):
        result = CliRunner().invoke(
            main, ["export", str(given), "--format", fmt, "--out", str(tmp_path / "out.gguf")]
        )
        assert result.exit_code == 2, result.output
        assert f"CHECKPOINT {given}" in result.output and "--model" not in result.output


def test_gguf_out_must_be_a_gguf_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"\.gguf"):
        export_checkpoint(str(tiny_model_dir), fmt="gguf", out=tmp_path / "model.bin", log=print)


# ---- the embedded model after real training (slow) ---------------------------------------------


@pytest.mark.slow
def test_embedded_model_after_lora_training_exports_to_matching_gguf(tmp_path: Path) -> None:
    """The demo's path: the embedded SmolLM2 (converted from its GGUF), a full warm-start
    checkpoint, one GRPO step with LoRA on top of it, then export of the run; llama.cpp's greedy
    tokens equal those of the trained model still in memory, and the original metadata is kept."""
    import yaml

    from grpokit.config import load_config
    from grpokit.hub.embedded import EMBEDDED_MODEL
    from grpokit.train.trainer import GRPOTrainer

    torch.set_num_threads(2)
    load_policy(EMBEDDED_MODEL, need_reference=False).save(tmp_path / "warm")  # as `grpokit sft`
    (tmp_path / "my_rewards.py").write_text(
        "def letter_e(prompts, completions, **columns):\n"
        "    texts = [c if isinstance(c, str) else c[0]['content'] for c in completions]\n"
        "    return [t.count('e') / max(1, len(t)) for t in texts]\n"
    )
    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:2])
    )
    doc = {
        "model": {
            "name_or_path": EMBEDDED_MODEL,
            "init_from": "warm",
            "lora": {"r": 8, "alpha": 16},
        },
        "data": {"train": "train.jsonl"},
        "rewards": [{"type": "python", "name": "e", "function": "my_rewards.py:letter_e"}],
        "training": {
            "learning_rate": 5e-3,
            "num_generations": 4,
            "per_device_train_batch_size": 4,
            "max_completion_length": 8,
            "max_steps": 1,
            "report_to": ["none"],
            "output_dir": "run",
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(doc))
    trainer = GRPOTrainer(load_config(tmp_path / "config.yaml"), progress=False)
    result = trainer.train()
    assert result.checkpoint is not None
    trained: Any = trainer.policy.model
    lora_b = [p for n, p in trained.named_parameters() if "lora_B" in n]
    assert any(float(p.abs().max()) > 0 for p in lora_b), "the step did not change the adapter"

    path = export_checkpoint(
        str(result.run_dir), fmt="gguf", out=tmp_path / "trained.gguf", outtype="f32", log=print
    )
    meta, original = read_metadata(path), read_metadata(find_embedded_gguf())
    for key in ("general.name", "general.license", "tokenizer.ggml.pre", "llama.block_count",
                "llama.rope.freq_base", "llama.attention.head_count_kv"):  # fmt: skip
        assert meta[key].value == original[key].value, key

    tokenizer = trainer.policy.tokenizer
    llm = open_llama(path)
    try:
        for text in PROMPTS:
            ids = chat_ids(tokenizer, text)
            rendered = str(tokenizer.decode(ids))
            assert llm.tokenize(rendered, add_bos=False, special=True) == ids
            assert llama_greedy(llm, ids, GREEDY_TOKENS) == torch_greedy(
                trained, ids, GREEDY_TOKENS
            )
    finally:
        llm.close()


def test_gguf_file_is_readable_by_others_under_umask_022(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Written to a temporary file and renamed: it gets open()'s mode, not mkstemp's 0600, so
    that a server running as another account can read it."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        out = export_checkpoint(str(tiny_model_dir), fmt="gguf", out=tmp_path / "m.gguf", log=print)
    finally:
        os.umask(old)
    assert stat.S_IMODE(Path(out).stat().st_mode) == 0o644
