"""The GGUF header read without mapping the file agrees with the gguf package's reader."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from grpokit.errors import UserError
from grpokit.hub.gguf_header import ARRAY, STRING, UINT32, read_header


def _write(path: Path) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.block_count", 2)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_string("tokenizer.chat_template", "{{ messages }} é")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "<|im_end|>"])
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.0, 0.0])
    writer.add_tensor("token_embd.weight", np.ones((3, 32), dtype=np.float32))
    writer.add_tensor("output.weight", np.ones((3, 32), dtype=np.float16))
    quantised = gguf.quantize(np.ones((3, 32), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", quantised, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_header_agrees_with_the_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    _write(path)
    header = read_header(path)
    reader = gguf.GGUFReader(path)
    assert header.tensor_types == {t.name: int(t.tensor_type) for t in reader.tensors}
    assert list(header.tensor_types.values()) == [0, 1, 8]  # F32, F16, Q8_0
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):  # the reader's own view of the file's fixed head
            continue
        assert header.metadata[name].value == field.contents(), name
    tokens = header.metadata["tokenizer.ggml.tokens"]
    assert (tokens.vtype, tokens.sub_type) == (ARRAY, STRING)
    assert header.metadata["llama.block_count"].vtype == UINT32


def test_a_cut_or_foreign_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    _write(path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UserError, match="the GGUF header is truncated"):
        read_header(cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(40))
    with pytest.raises(UserError, match="is not a GGUF file"):
        read_header(other)
