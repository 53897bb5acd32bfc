"""GGUF export of models with the tokenizers of the families people fine-tune (Llama 3, Qwen2,
SmolLM, GPT-2, Mistral Nemo): llama.cpp gets the pre-tokenizer that cuts text as transformers
does, shown by llama.cpp giving transformers' tokens, logits and greedy continuation; a
tokenizer llama.cpp cannot reproduce is refused, naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.errors import UserError
from grpokit.models.gguf_export import pre_tokenizer_kv, read_metadata
from grpokit.models.gguf_pretokenizer import QWEN2_PATTERN, pre_tokenizer_name
from grpokit.models.tiny import TOKENIZER_FAMILIES, make_tiny_model_dir, make_tiny_tokenizer_dir

from .gguf_checks import (
    assert_close_logits,
    chat_ids,
    llama_greedy,
    open_llama,
    tiny_of,
    torch_greedy,
)

# Text where the families' cutting rules differ: contractions in capitals, digit runs, case
# changes inside a word, punctuation before words, tabs, blank lines and trailing spaces.
PROBE = (
    "I've 12345 HelloWorld\n\n  x ?! 'RE you sure? 3.14 3...3 café\t\tend print(add(2, 3))"
    "  # prints 5\n\tif i % 2 == 0:\n   "
)
# llama.cpp's name for each family's pre-tokenizer, and the transformers architecture of its models.
EXPECTED = {
    "llama3": ("llama-bpe", "llama"),
    "qwen2": ("qwen2", "qwen2"),
    "smollm": ("smollm", "llama"),
    "gpt2": ("gpt-2", "llama"),
    "tekken": ("tekken", "mistral"),
}


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {family: make_tiny_tokenizer_dir(root / family, family) for family in TOKENIZER_FAMILIES}


def _tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def test_each_family_gets_llama_cpp_s_name_for_its_pre_tokenizer(
    tokenizer_dirs: dict[str, Path],
) -> None:
    assert set(EXPECTED) == set(TOKENIZER_FAMILIES)
    for family, directory in tokenizer_dirs.items():
        assert pre_tokenizer_kv(_tokenizer(directory)).value == EXPECTED[family][0], family


def test_the_probe_text_tells_the_families_apart(tokenizer_dirs: dict[str, Path]) -> None:
    """The families share one trained vocabulary and differ only in how they cut text, and each
    cuts the probe into different tokens: a wrong pre-tokenizer in llama.cpp would show up as
    different tokens in the end-to-end test below."""
    tokens = {}
    for family, directory in tokenizer_dirs.items():
        tokenizer = _tokenizer(directory)
        ids = tokenizer(PROBE, add_special_tokens=False)["input_ids"]
        tokens[family] = tuple(tokenizer.convert_ids_to_tokens(ids))
    assert len(set(tokens.values())) == len(tokens), tokens


@pytest.mark.parametrize("family", TOKENIZER_FAMILIES)
def test_gguf_tokenizes_and_generates_as_transformers_for_each_family(
    family: str, tokenizer_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    name, arch = EXPECTED[family]
    if arch == "llama":
        model_dir = make_tiny_model_dir(
            tmp_path / "model", seed=1, tokenizer_dir=tokenizer_dirs[family], initializer_range=0.3
        )
    else:
        model_dir = tiny_of(arch, tokenizer_dirs[family], tmp_path / "model")
    out = tmp_path / "model.gguf"
    result = CliRunner().invoke(
        main, ["export", str(model_dir), "--format", "gguf", "--outtype", "f32", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert f"pre-tokenizer '{name}'" in result.output
    meta = read_metadata(out)
    assert meta["tokenizer.ggml.pre"].value == name

    tokenizer = _tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    llm = open_llama(out)
    try:
        # BOS added or not as transformers adds it (Llama 3 does), special tokens recognised.
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": PROBE}], tokenize=False, add_generation_prompt=True
        )
        for text in (PROBE, rendered):
            expected = tokenizer(text)["input_ids"]
            assert llm.tokenize(text, add_bos=True, special=True) == expected, text
        ids = chat_ids(tokenizer, "What is 17 + 25?")
        greedy = torch_greedy(model, ids, 12)
        assert len(set(greedy)) > 3, "degenerate reference continuation"
        assert_close_logits(llm, model, ids + greedy)
        assert llama_greedy(llm, ids, 12) == greedy
    finally:
        llm.close()


def test_a_pre_tokenizer_llama_cpp_lacks_is_refused_naming_the_tokenizer(
    tokenizer_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A byte-level BPE tokenizer that cuts words at every letter-digit boundary with its own
    pattern: llama.cpp has no rule for it, so the export stops before writing anything."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    model_dir = make_tiny_model_dir(tmp_path / "odd-model", tokenizer_dir=tokenizer_dirs["gpt2"])
    backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{L}+|\p{N}+|[^\p{L}\p{N}]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.save(str(model_dir / "tokenizer.json"))
    out = tmp_path / "odd.gguf"
    result = CliRunner().invoke(
        main, ["export", str(model_dir), "--format", "gguf", "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "odd-model" in message and "no llama.cpp pre-tokenizer" in message
    assert "\\p{L}+|\\p{N}+" in message and "convert_hf_to_gguf.py" in message
    assert not out.exists() and not list(tmp_path.glob(".odd.gguf*"))


def test_same_cutting_but_other_ignore_merges_is_refused(tokenizer_dirs: dict[str, Path]) -> None:
    spec = json.loads(_tokenizer(tokenizer_dirs["qwen2"]).backend_tokenizer.to_str())
    assert pre_tokenizer_name(spec, "qwen") == "qwen2"
    spec["model"]["ignore_merges"] = True
    with pytest.raises(UserError, match=r"qwen.*'qwen2'.*ignore_merges True"):
        pre_tokenizer_name(spec, "qwen")
    # Llama 3's pattern exists in llama.cpp both with and without ignore_merges.
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2_PATTERN.replace(
        r"\p{N}|", r"\p{N}{1,3}|"
    )
    assert pre_tokenizer_name(spec, "llama") == "llama-bpe"
    spec["model"]["ignore_merges"] = False
    assert pre_tokenizer_name(spec, "llama") == "smaug-bpe"


def test_a_sentencepiece_tokenizer_is_refused_naming_it(tmp_path: Path) -> None:
    """Llama 2 / Mistral 7B style (Metaspace, byte fallback): a vocabulary type this export does
    not write."""
    from transformers import LlamaTokenizer

    directory = tmp_path / "llama2-style"
    LlamaTokenizer().save_pretrained(directory)
    with pytest.raises(UserError, match=r"llama2-style is a SentencePiece-style BPE tokenizer"):
        pre_tokenizer_kv(_tokenizer(directory))


def test_the_embedded_tokenizer_keeps_the_pre_tokenizer_of_its_gguf(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """transformers' conversion of the embedded SmolLM2 GGUF drops its digit split, so the
    tokenizer alone says gpt-2; the export recognises the vocabulary of the GGUF it came from and
    writes that file's 'smollm' instead."""
    assert pre_tokenizer_kv(_tokenizer(tiny_model_dir)).value == "gpt-2"
    out = tmp_path / "m.gguf"
    result = CliRunner().invoke(
        main, ["export", str(tiny_model_dir), "--format", "gguf", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert read_metadata(out)["tokenizer.ggml.pre"].value == "smollm"
