"""`grpokit export --quantize q4_k_m` (and q5_k_m, q6_k): llama.cpp's own quantiser applied to an
f16 export; the files run in llama.cpp close to the PyTorch model."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.errors import UserError
from grpokit.models.export import export_checkpoint
from grpokit.models.gguf_export import GGUF_TYPES, read_metadata
from grpokit.models.tiny import make_tiny_model_dir, make_tiny_tokenizer_dir

from .gguf_checks import chat_ids, open_llama

# llama.cpp's file type number, and the k-quant every matrix of a 256-wide model may use.
K_QUANTS = {
    "q4_k_m": (15, {"Q4_K", "Q6_K"}),
    "q5_k_m": (17, {"Q5_K", "Q6_K"}),
    "q6_k": (18, {"Q6_K"}),
}


@pytest.fixture(scope="module")
def model_256(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose rows are 256 or 512 long, multiples of the k-quants' block (Llama 3
    tokenizer, 640 tokens; weights at transformers' usual initial scale, where the logits of a
    random model are not so large that 4-bit rounding scrambles them)."""
    pytest.importorskip("cyllama", reason="cyllama runs llama.cpp's quantiser")
    root = tmp_path_factory.mktemp("k-quant")
    tokenizer = make_tiny_tokenizer_dir(root / "tokenizer", "llama3")
    return make_tiny_model_dir(
        root / "model",
        seed=2,
        tokenizer_dir=tokenizer,
        hidden_size=256,
        intermediate_size=512,
    )


def test_k_quants_come_from_llama_cpp_and_stay_close_to_pytorch(
    model_256: Path, tmp_path: Path
) -> None:
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_256, dtype=torch.float32).eval()
    ids = chat_ids(AutoTokenizer.from_pretrained(model_256), "What is 17 + 25?")
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids])).logits[0]
    sizes = {}
    for outtype, min_cosine in (("f16", 0.9999), ("q6_k", 0.995), ("q5_k_m", 0.99),
                                ("q4_k_m", 0.97)):  # fmt: skip
        result = CliRunner().invoke(
            main,
            [
                "export",
                str(model_256),
                "--format",
                "gguf",
                "--quantize",
                outtype,
                "--out",
                str(tmp_path),
            ],
        )
        assert result.exit_code == 0, result.output
        path = tmp_path / f"model-{outtype}.gguf"
        sizes[outtype] = path.stat().st_size
        if outtype in K_QUANTS:
            file_type, k_types = K_QUANTS[outtype]
            assert read_metadata(path)["general.file_type"].value == file_type
            tensors = gguf.GGUFReader(path).tensors
            matrices = {t.tensor_type.name for t in tensors if len(t.shape) > 1}
            assert matrices == k_types, (outtype, matrices)  # no fallback at these widths
            assert "not a multiple of 256" not in result.output
        llm = open_llama(path)
        try:
            got = torch.tensor(llm.logits(ids))
        finally:
            llm.close()
        # Logits at every position point the same way as PyTorch's, less closely with fewer bits.
        cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
        assert float(cosine.min()) > min_cosine, (outtype, float(cosine.min()))
        agree = (got.argmax(-1) == expected.argmax(-1)).float().mean()
        assert float(agree) >= 0.85, (outtype, float(agree))
    assert sizes["q4_k_m"] < sizes["q5_k_m"] < sizes["q6_k"] < sizes["f16"]
    # Only the finished files and the fidelity check's record beside each (export checks by
    # default): the f16 intermediate and the temporaries are gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"model-{t}.gguf{record}" for t in ("f16", *K_QUANTS) for record in ("", ".fidelity.json")
    )


def test_widths_below_the_k_quant_block_fall_back_per_tensor(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Rows of 64 or 128 values cannot hold 256-value k-quant blocks: llama.cpp stores those
    tensors in a 32-value type instead, and the export says so."""
    pytest.importorskip("cyllama", reason="cyllama runs llama.cpp's quantiser")
    notes: list[str] = []
    path = export_checkpoint(
        str(tiny_model_dir), fmt="gguf", out=tmp_path / "m.gguf", outtype="q4_k_m",
        log=notes.append,
    )  # fmt: skip
    assert any("not a multiple of 256" in n and "q5_0" in n for n in notes), notes
    assert read_metadata(path)["general.file_type"].value == 15
    llm = open_llama(path)
    try:
        assert len(llm.tokenize("Hello world")) > 0
    finally:
        llm.close()


def test_unknown_quantisation_names_the_option(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "export",
            str(tiny_model_dir),
            "--format",
            "gguf",
            "--quantize",
            "q3_k_s",
            "--out",
            str(tmp_path / "m.gguf"),
        ],
    )
    assert result.exit_code == 2
    assert "--quantize" in result.output and "q4_k_m" in result.output
    with pytest.raises(UserError, match=r"--outtype/--quantize q3_k_s: use one of .*q4_k_m"):
        export_checkpoint(
            str(tiny_model_dir), fmt="gguf", out=tmp_path / "m.gguf",
            outtype="q3_k_s",  # type: ignore[arg-type]
        )  # fmt: skip
    assert not list(tmp_path.iterdir())


def test_the_cli_offers_every_gguf_type() -> None:
    export = main.commands["export"]  # type: ignore[attr-defined]
    option = next(p for p in export.params if p.name == "outtype")
    assert tuple(option.type.choices) == GGUF_TYPES
    assert {"--outtype", "--quantize"} <= set(option.opts)


_WITHOUT_CYLLAMA = """
import sys
sys.modules["cyllama"] = None  # cyllama not installed: its import fails
from grpokit.cli import main
main(sys.argv[1:])
"""


def test_quantising_without_cyllama_says_what_to_install(
    tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    out = tmp_path / "m.gguf"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _WITHOUT_CYLLAMA,
            "export",
            str(tiny_model_factory(seed=0)),
            "--format",
            "gguf",
            "--quantize",
            "q4_k_m",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    message = " ".join(done.stderr.split())
    assert "--outtype/--quantize q4_k_m" in message and "pip install 'cyllama" in message
    assert "choose f16 or q8_0" in message
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_a_gguf_export_without_cyllama_is_written_and_its_check_skipped_with_a_note(
    tiny_model_factory: Callable[..., Path], tmp_path: Path
) -> None:
    """The default --check needs llama.cpp in-process; without it the export still succeeds."""
    out = tmp_path / "m.gguf"
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_CYLLAMA, "export", str(tiny_model_factory(seed=0)),
         "--format", "gguf", "--outtype", "f16", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.is_file() and out.stat().st_size > 0
    assert "fidelity: not checked" in done.stdout and "grpokit[gguf]" in done.stdout
    assert not (tmp_path / "m.gguf.fidelity.json").exists()
