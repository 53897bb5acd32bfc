"""Writing a transformers causal LM as a GGUF file that llama.cpp (and the tools built on it) runs.

Mapped architectures: Llama (which includes the embedded SmolLM2), SmolLM3, Mistral without a
sliding window, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3 (text), Phi-3, GPT-2 and OLMo 2, each to
llama.cpp's own architecture of that name; the per-family table (tensor transforms,
hyperparameters, what llama.cpp cannot reproduce) is :mod:`grpokit.models.gguf_arch`. Anything else is refused with a
message naming the architecture.

Tokenizer: when the model's tokenizer is the one of a known GGUF file (the file the model was
converted from, or the embedded model's), that file's tokenizer metadata is carried over as is,
including llama.cpp's pre-tokenizer name. Otherwise the metadata is built from the tokenizer's
``tokenizer.json``: for byte-level BPE tokenizers (GPT-2 style), with the llama.cpp pre-tokenizer
that reproduces it (:mod:`grpokit.models.gguf_pretokenizer`); for SentencePiece-style ones (Gemma,
Llama 2), as llama.cpp's SentencePiece vocabulary (:mod:`grpokit.models.gguf_spm`); a tokenizer
llama.cpp cannot reproduce is refused.

Quantisation: f32, f16 and q8_0 are written here; q4_k_m, q5_k_m and q6_k are made by llama.cpp's
own quantiser from an f16 file written first (:mod:`grpokit.models.gguf_quantize`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, cast, get_args

import numpy as np
import torch

from grpokit.errors import UserError
from grpokit.files import set_default_mode
from grpokit.hub.gguf_header import ARRAY as _ARRAY
from grpokit.hub.gguf_header import BOOL as _BOOL
from grpokit.hub.gguf_header import FLOAT32 as _FLOAT32
from grpokit.hub.gguf_header import INT32 as _INT32
from grpokit.hub.gguf_header import KV, read_metadata
from grpokit.hub.gguf_header import STRING as _STRING
from grpokit.hub.gguf_header import UINT32 as _UINT32
from grpokit.models.gguf_arch import (
    ARCHITECTURES,
    ArchSpec,
    arch_spec,
    gguf_tensors,
    hyperparameters,
    rotate_pairs_layout,
    text_config,
)
from grpokit.models.gguf_pretokenizer import pre_tokenizer_name
from grpokit.models.gguf_quantize import (
    OUTTYPE_OPTION,
    QUANTIZED_TYPES,
    quantize_gguf,
    require_llama_cpp,
)
from grpokit.models.gguf_spm import is_byte_token, merge_scores, sentencepiece_style
from grpokit.progress import progress

__all__ = [
    "ARCHITECTURES",
    "GGUF_TYPES",
    "KV",
    "ArchSpec",
    "arch_spec",
    "gguf_tensors",
    "hyperparameters",
    "read_metadata",
    "rotate_pairs_layout",
    "tokenizer_metadata",
    "write_gguf",
]

WrittenType = Literal["f32", "f16", "q8_0"]
GGUFType = Literal["f32", "f16", "q8_0", "q4_k_m", "q5_k_m", "q6_k"]
GGUF_TYPES: tuple[GGUFType, ...] = get_args(GGUFType)
"""Output types: f32, f16 and q8_0 are written here; the k-quant mixes are made from an f16 file
by llama.cpp's quantiser (:mod:`grpokit.models.gguf_quantize`)."""

# llama.cpp token types.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
# Blocks of Q8_0 hold 32 values of one row.
_Q8_0_BLOCK = 32


def encode_tensor(array: np.ndarray, outtype: WrittenType) -> tuple[np.ndarray, int | None]:
    """The array as stored for ``outtype``, and its raw gguf.GGMLQuantizationType (None: inferred
    from the numpy dtype).

    One-dimensional tensors (norms, biases) stay float32 in every output type, as llama.cpp's own
    converter keeps them; Q8_0 needs rows that are a multiple of 32 long, other matrices fall back
    to float16.
    """
    if outtype == "f32" or array.ndim < 2:
        return array.astype(np.float32), None
    if outtype == "q8_0" and array.shape[-1] % _Q8_0_BLOCK == 0:
        import gguf

        q8 = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(array.astype(np.float32), q8), int(q8)
    return array.astype(np.float16), None


def check_outtype(outtype: str) -> None:
    """:class:`UserError` for an unknown output type, or a k-quant mix without llama.cpp (cyllama)
    (checked before any work)."""
    if outtype not in GGUF_TYPES:
        raise UserError(f"{OUTTYPE_OPTION} {outtype}: use one of {', '.join(GGUF_TYPES)}.")
    if outtype in QUANTIZED_TYPES:
        require_llama_cpp(outtype)


def _file_type(outtype: WrittenType) -> int:
    import gguf

    return int(
        {
            "f32": gguf.LlamaFileType.ALL_F32,
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        }[outtype]
    )


# ---- tokenizer metadata --------------------------------------------------------------------------


def _tokenizer_name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def _tokenizer_json(tokenizer: Any) -> dict[str, Any]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise UserError(
            f"GGUF export needs a fast tokenizer (a tokenizer.json); the tokenizer of "
            f"{_tokenizer_name(tokenizer)} is a {type(tokenizer).__name__}. Export with --format "
            "hf and convert the directory with llama.cpp's convert_hf_to_gguf.py."
        )
    spec: dict[str, Any] = json.loads(backend.to_str())
    return spec


def pre_tokenizer_kv(tokenizer: Any) -> KV:
    """``tokenizer.ggml.pre``: llama.cpp's rule for cutting text before BPE, recognised from the
    tokenizer (see :mod:`grpokit.models.gguf_pretokenizer`); :class:`UserError` when unknown."""
    name = pre_tokenizer_name(_tokenizer_json(tokenizer), _tokenizer_name(tokenizer))
    return KV("tokenizer.ggml.pre", name, _STRING)


def vocab_metadata(tokenizer: Any, n_vocab: int) -> list[KV]:
    """``tokenizer.*`` keys but the pre-tokenizer's: vocabulary, token types, merges or scores,
    special tokens, chat template, from the tokenizer's tokenizer.json: llama.cpp's ``gpt2``
    vocabulary for a byte-level BPE tokenizer, its ``llama`` (SentencePiece) vocabulary for a
    SentencePiece-style one (:mod:`grpokit.models.gguf_spm`).

    ``n_vocab`` is the model's embedding rows; ids the tokenizer does not use are filled with
    unused placeholder tokens, since llama.cpp needs one token per row.
    """
    spec = _tokenizer_json(tokenizer)
    style = sentencepiece_style(spec, _tokenizer_name(tokenizer))
    vocab: dict[str, int] = tokenizer.get_vocab()
    too_big = [t for t, i in vocab.items() if i >= n_vocab]
    if too_big:
        raise UserError(
            f"GGUF export: the tokenizer has {len(too_big)} token(s) (e.g. {too_big[0]!r}) beyond "
            f"the model's {n_vocab} embedding rows; resize the embeddings before exporting."
        )
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [_UNUSED] * n_vocab
    for token, index in vocab.items():
        tokens[index], types[index] = token, _NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    if style is not None:
        for index, token in enumerate(tokens):
            if types[index] == _NORMAL and is_byte_token(token):
                types[index] = _BYTE
    for index, added in tokenizer.added_tokens_decoder.items():
        if index < n_vocab:
            tokens[index] = added.content
            types[index] = _CONTROL if added.special else _USER_DEFINED
    unk = getattr(tokenizer, "unk_token_id", None)
    if style is not None and unk is not None and unk < n_vocab:
        types[unk] = _UNKNOWN
    if style is None:
        kvs = [
            KV("tokenizer.ggml.model", "gpt2", _STRING),
            KV("tokenizer.ggml.tokens", tokens, _ARRAY, _STRING),
            KV("tokenizer.ggml.token_type", types, _ARRAY, _INT32),
            KV("tokenizer.ggml.merges", merges, _ARRAY, _STRING),
        ]
    else:
        kvs = [
            KV("tokenizer.ggml.model", "llama", _STRING),
            KV("tokenizer.ggml.tokens", tokens, _ARRAY, _STRING),
            KV("tokenizer.ggml.scores", merge_scores(merges, tokens), _ARRAY, _FLOAT32),
            KV("tokenizer.ggml.token_type", types, _ARRAY, _INT32),
        ]
    for key, attr in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("unknown_token_id", "unk_token_id"),
        ("padding_token_id", "pad_token_id"),
    ):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            kvs.append(KV(f"tokenizer.ggml.{key}", int(value), _UINT32))
    # Whether encoding adds BOS / EOS, as llama.cpp must (its default depends on the rule).
    sample = tokenizer("a", add_special_tokens=True)["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    kvs.append(KV("tokenizer.ggml.add_bos_token", bos is not None and sample[:1] == [bos], _BOOL))
    kvs.append(KV("tokenizer.ggml.add_eos_token", eos is not None and sample[-1:] == [eos], _BOOL))
    prefix = style is not None and style.add_space_prefix
    kvs.append(KV("tokenizer.ggml.add_space_prefix", prefix, _BOOL))
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        kvs.append(KV("tokenizer.chat_template", template, _STRING))
    return kvs


def tokenizer_metadata(tokenizer: Any, n_vocab: int) -> list[KV]:
    """All ``tokenizer.*`` keys: :func:`vocab_metadata` and, for a byte-level BPE tokenizer, the
    pre-tokenizer. Raises :class:`UserError` naming the tokenizer when llama.cpp cannot
    reproduce it."""
    kvs = vocab_metadata(tokenizer, n_vocab)
    if kvs[0].value != "gpt2":  # SentencePiece: llama.cpp has one way of cutting text
        return kvs
    return [kvs[0], pre_tokenizer_kv(tokenizer), *kvs[1:]]


def _same_tokenizer(ours: list[KV], theirs: Mapping[str, KV]) -> bool:
    """Whether a GGUF's tokenizer metadata describes the same vocabulary and merges as ours."""
    mine = {kv.key: kv.value for kv in ours}
    keys = ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges")
    return all(key in theirs and theirs[key].value == mine[key] for key in keys if key in mine)


def _reference_ggufs(source: Path | None) -> list[Path]:
    """GGUF files whose tokenizer metadata may be reused: the source, then the embedded model's."""
    from grpokit.hub.embedded import find_embedded_gguf

    found = [source] if source is not None else []
    try:
        embedded = find_embedded_gguf()
    except UserError:
        return found
    if all(embedded.resolve() != p.resolve() for p in found):
        found.append(embedded)
    return found


def export_metadata(
    config: Any,
    tokenizer: Any,
    *,
    outtype: WrittenType,
    source: Path | None,
    name: str | None,
    log: Callable[[str], None] = print,
) -> list[KV]:
    """All metadata of the exported file (the architecture key excepted: the writer adds it).

    From ``source`` (the GGUF the model was converted from), its ``general.*`` entries are carried
    over; its tokenizer entries are reused when its vocabulary matches the tokenizer's. Otherwise
    the tokenizer metadata is built from the tokenizer, which llama.cpp must be able to reproduce
    (:class:`UserError` naming it if not).
    """
    spec = arch_spec(config)
    config = text_config(config, spec)
    n_vocab = int(config.vocab_size)
    ours = vocab_metadata(tokenizer, n_vocab)
    source_meta = read_metadata(source) if source is not None else {}
    kvs: dict[str, KV] = {}
    skip = {"general.architecture", "general.file_type", "general.quantization_version"}
    for key, kv in source_meta.items():
        if key.startswith("general.") and key not in skip:
            kvs[key] = kv
    if name is not None:
        kvs["general.name"] = KV("general.name", name, _STRING)
    kvs.setdefault("general.name", KV("general.name", "grpokit model", _STRING))
    kvs["general.file_type"] = KV("general.file_type", _file_type(outtype), _UINT32)
    if outtype == "q8_0":
        import gguf

        kvs["general.quantization_version"] = KV(
            "general.quantization_version", int(gguf.GGML_QUANT_VERSION), _UINT32
        )
    for kv in hyperparameters(config, spec, n_vocab):
        kvs[kv.key] = kv
    for ref in _reference_ggufs(source):
        meta = source_meta if ref == source else read_metadata(ref)
        if _same_tokenizer(ours, meta):
            template = next((kv for kv in ours if kv.key == "tokenizer.chat_template"), None)
            for key, kv in meta.items():
                if key.startswith("tokenizer."):
                    kvs[key] = kv
            if template is not None:  # the checkpoint's template wins over the file's
                kvs[template.key] = template
            return list(kvs.values())
    if ours[0].value != "gpt2":
        log("tokenizer: SentencePiece-style BPE, written as llama.cpp's 'llama' vocabulary")
        built = ours
    else:
        pre = pre_tokenizer_kv(tokenizer)
        log(f"tokenizer: llama.cpp pre-tokenizer '{pre.value}' (recognised from tokenizer.json)")
        built = [ours[0], pre, *ours[1:]]
    for kv in built:
        kvs[kv.key] = kv
    return list(kvs.values())


def write_gguf(
    model: torch.nn.Module,
    tokenizer: Any,
    out: Path,
    *,
    outtype: GGUFType = "f16",
    source: Path | None = None,
    name: str | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Write ``model`` (a transformers causal LM, LoRA already merged) as a GGUF file.

    Args:
        model: the model; its config decides the architecture mapping.
        tokenizer: its tokenizer (vocabulary, special tokens, chat template).
        out: the file to write; it appears complete or not at all (written beside, renamed).
        outtype: tensor storage, one of :data:`GGUF_TYPES`; a k-quant mix needs cyllama.
        source: the GGUF the model was converted from, whose metadata is carried over.
        name: ``general.name`` (default: the source's, or "grpokit model").
        log: where notes go.

    Returns:
        ``out``.
    """
    import gguf

    check_outtype(outtype)
    quantized = outtype in QUANTIZED_TYPES
    written = cast(WrittenType, "f16" if quantized else outtype)
    config = model.config
    spec = arch_spec(config)
    metadata = export_metadata(
        config, tokenizer, outtype=written, source=source, name=name, log=log
    )
    if spec.language_model is not None:
        log(
            "writing the language model only: llama.cpp reads a vision tower from a file of its own"
        )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporaries = []
    try:
        for _ in range(2 if quantized else 1):
            fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
            os.close(fd)
            temporaries.append(Path(tmp_name))
        writer = gguf.GGUFWriter(temporaries[0], spec.gguf_arch)
        for kv in metadata:
            sub = None if kv.sub_type is None else gguf.GGUFValueType(kv.sub_type)
            writer.add_key_value(kv.key, kv.value, gguf.GGUFValueType(kv.vtype), sub)
        state = model.state_dict()
        with progress("converting tensors", len(state), log=log) as bar:
            for tensor_name, array in gguf_tensors(state, text_config(config, spec), spec):
                data, raw = encode_tensor(array, written)
                raw_dtype = None if raw is None else gguf.GGMLQuantizationType(raw)
                writer.add_tensor(tensor_name, data, raw_dtype=raw_dtype)
                bar.advance(1, tensor_name)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        if quantized:
            quantize_gguf(temporaries[0], temporaries[1], outtype, log=log)
        set_default_mode(temporaries[-1])  # mkstemp's 0600 would keep it from a server's account
        os.replace(temporaries[-1], out)
    finally:
        for tmp in temporaries:
            tmp.unlink(missing_ok=True)
    return out
