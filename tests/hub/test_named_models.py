"""Named offline models (chunked GGUF packages joined and checked against a pinned sha256), any
GGUF file as a model, and a tied head that llama.cpp's quantiser stored twice tied again."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from grpokit.cli import main
from grpokit.errors import UserError
from grpokit.files import current_umask
from grpokit.hub import named
from grpokit.hub.convert import MARKER_FILE, tie_if_tied_at_source
from grpokit.hub.named import NAMED_MODELS, gguf_file, model_table
from grpokit.hub.resolve import resolve_model_path
from grpokit.models.checkpoints import resolve_model


def _fake_packages(root: Path, chunks: list[bytes]) -> named.NamedModel:
    """Packages fakepartN/data/partNN.bin on sys.path holding ``chunks``, and their entry."""
    for i, chunk in enumerate(chunks, start=1):
        (root / f"fakepart{i}" / "data").mkdir(parents=True)
        (root / f"fakepart{i}" / "__init__.py").write_text("raise ImportError('never imported')")
        (root / f"fakepart{i}" / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    whole = b"".join(chunks)
    return replace(
        NAMED_MODELS["qwen2.5-coder-0.5b-instruct"],
        name="fake-model",
        packages=tuple(f"fakepart{i}==1.0" for i in range(1, len(chunks) + 1)),
        parts=tuple(f"fakepart{i}/data/part{i:02d}.bin" for i in range(1, len(chunks) + 1)),
        gguf_name="fake.gguf",
        gguf_bytes=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
    )


def test_parts_are_joined_in_order_once_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "site").mkdir()
    model = _fake_packages(tmp_path / "site", [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7])
    cache = tmp_path / "cache"
    path = gguf_file(model, cache)
    assert path == cache / "gguf" / "fake.gguf"
    assert path.read_bytes() == b"GGUF" + b"a" * 100 + b"b" * 50 + b"c" * 7
    assert path.stat().st_mode & 0o777 == 0o666 & ~current_umask()  # readable as the umask says
    mtime = path.stat().st_mtime_ns
    assert gguf_file(model, cache) == path and path.stat().st_mtime_ns == mtime  # not rejoined

    # A part of another version: the joined file's sha256 differs, nothing is left behind.
    with pytest.raises(UserError, match="sha256 .* not the pinned .* pip install --force"):
        gguf_file(replace(model, gguf_name="other.gguf", sha256="0" * 64), cache)
    assert sorted(p.name for p in (cache / "gguf").iterdir() if not p.name.endswith(".lock")) == [
        "fake.gguf"
    ]


def test_a_model_not_installed_says_how_to_install_it(tmp_path: Path) -> None:
    model = replace(
        NAMED_MODELS["gemma-3-270m"],
        parts=("no_such_pkg_part1/data/x.part00", "no_such_pkg_part2/data/x.part01"),
    )
    with pytest.raises(UserError) as err:
        gguf_file(model, tmp_path)
    message = str(err.value)
    assert "no-such-pkg-part1, no-such-pkg-part2" in message
    assert "scripts/setup.sh models gemma-3-270m" in message


def test_the_registry_pins_every_model() -> None:
    assert list(NAMED_MODELS)[0] == "smollm2-135m-instruct"
    for model in list(NAMED_MODELS.values())[1:]:  # chunked: versions and the file's hash pinned
        assert all("==" in p for p in model.packages)
        assert len(model.sha256) == 64 and len(model.parts) > 1
    for model in NAMED_MODELS.values():
        assert model.parameters > 0 and model.gguf_bytes > 0 and model.license


def test_models_command_lists_each_with_its_cost() -> None:
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0, result.output
    for name in NAMED_MODELS:
        assert name in result.output
    assert "f32 weights" in result.output and "full FT" in result.output
    assert "1.8 GiB" in model_table([NAMED_MODELS["qwen2.5-coder-0.5b-instruct"]])
    bad = CliRunner().invoke(main, ["models", "llama-9000"])
    assert bad.exit_code == 2 and "unknown model(s) llama-9000" in bad.output


def test_a_head_stored_apart_from_its_embeddings_is_tied_again(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, tie_word_embeddings=False)
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert head.weight is not embeddings.weight
    torch.manual_seed(0)
    with torch.no_grad():  # the head: the embeddings plus quantisation-sized noise
        head.weight.copy_(
            embeddings.weight + 0.04 * embeddings.weight.std() * torch.randn_like(head.weight)
        )
    finer = head.weight.detach().clone()
    assert tie_if_tied_at_source(model, {"output.weight": 8.5, "token_embd.weight": 5.5})
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert torch.equal(model.get_input_embeddings().weight, finer)  # the finer copy is kept
    assert model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters()
    )

    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir, tie_word_embeddings=False)
    with torch.no_grad():  # a head trained apart: about sqrt(2) away
        other.get_output_embeddings().weight.copy_(
            torch.randn_like(other.get_output_embeddings().weight) * embeddings.weight.std()
        )
    assert not tie_if_tied_at_source(other, {})
    assert other.get_output_embeddings().weight is not other.get_input_embeddings().weight


def test_any_gguf_file_is_a_model(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF exported by grpokit (or llama.cpp's converter) converts once into the cache and then
    loads as the model it was, logits within float32 rounding of the original's."""
    from transformers import AutoModelForCausalLM

    from grpokit.models.export import export_checkpoint

    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    gguf = export_checkpoint(
        str(tiny_model_dir), fmt="gguf", out=tmp_path / "mine.gguf", outtype="f32", log=print
    )
    converted = Path(resolve_model_path(str(gguf)))
    assert converted.parent == tmp_path / "cache" / "models"
    assert converted.name.startswith("gguf-mine-")
    assert json.loads((converted / MARKER_FILE).read_text())["gguf_path"] == str(gguf.resolve())
    assert resolve_model_path(str(gguf)) == str(converted)  # once
    # eval, generate and export take it as --model / CHECKPOINT too
    spec = resolve_model(f"mine={gguf}")
    assert (spec.label, spec.name_or_path, spec.init_from) == ("mine", str(gguf), None)
    ids = torch.tensor([[1, 5, 9, 77, 300, 12]])
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits
        got = AutoModelForCausalLM.from_pretrained(converted)(input_ids=ids).logits
    # f32 weights written and read back unchanged: only the order of float32 sums can differ.
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path / "cache"))
    fake = tmp_path / "weights.gguf"
    fake.write_bytes(b"not a gguf at all")
    with pytest.raises(UserError, match="is not a GGUF file"):
        resolve_model_path(str(fake))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(UserError, match="not a .gguf; give a GGUF file"):
        resolve_model_path(str(other))
