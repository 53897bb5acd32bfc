"""How each transformers causal-LM family maps onto a llama.cpp architecture, as a table.

One :class:`ArchSpec` per transformers class says what llama.cpp's graph for that architecture
needs and the checkpoint does not say in the same way:

- tensor names come from the ``gguf`` package's own table (``gguf.get_tensor_name_map``), the one
  llama.cpp's converter uses; only the values are transformed here;
- the RoPE layout: llama.cpp's ``llama`` and ``smollm3`` architectures rotate adjacent pairs of
  each head's dimensions, transformers rotates the first half against the second half, so q/k
  rows are reordered for them (the other architectures here rotate halves in both);
- Gemma's RMSNorm multiplies by ``1 + w`` where llama.cpp multiplies by ``w``: 1 is added to every
  norm weight. Gemma's embedding scaling by sqrt(hidden size) is built into llama.cpp's graph;
- GPT-2's ``Conv1D`` layers store weights as (in, out): they are transposed to (out, in);
- the output layer: tied to the embeddings (Gemma, Gemma 2), optional, or, for OLMo 2, required
  (the embedding matrix is written a second time when the checkpoint ties them);
- hyperparameters llama.cpp reads under ``<arch>.*`` (the ``gguf.Keys`` names): the shared ones
  from :func:`hyperparameters`, and per family Gemma's logit soft-capping, sliding-window layers
  and local RoPE base, Phi-3's partial rotary dimensions, LongRoPE and Llama 3 RoPE factors.

What llama.cpp's graph cannot reproduce (an activation it does not use, an attention scale it
computes differently, an unsupported RoPE scaling) is refused with :class:`UserError` before any
file is written, rather than written into a model that generates different text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from grpokit.errors import UserError
from grpokit.hub.gguf_header import ARRAY, BOOL, FLOAT32, KV, STRING, UINT32

_CONVERT = (
    "Export with --format hf and convert the directory with llama.cpp's convert_hf_to_gguf.py."
)


@dataclass(frozen=True)
class Tensor:
    """A tensor llama.cpp needs that the state dict does not hold (e.g. RoPE factors)."""

    name: str
    array: np.ndarray


ExtraKeys = Callable[[Any, str], list[KV]]
"""(transformers config, llama.cpp architecture) -> family-specific metadata; raises UserError for
settings llama.cpp does not reproduce."""
ExtraTensors = Callable[[Any], list[Tensor]]


def _no_keys(config: Any, arch: str) -> list[KV]:
    return []


def _no_tensors(config: Any) -> list[Tensor]:
    return []


@dataclass(frozen=True)
class ArchSpec:
    """How one transformers architecture maps to llama.cpp."""

    gguf_arch: str
    """llama.cpp's architecture name (the prefix of its hyperparameter keys)."""
    reorder_rope_rows: bool = False
    """Whether q/k rows are reordered from rotate-half to rotate-pairs layout (module doc)."""
    activations: tuple[str, ...] = ("silu",)
    """transformers activation names equal to the one llama.cpp's graph uses for this family."""
    norm: Literal["rms", "layer"] = "rms"
    """RMSNorm (epsilon key ``layer_norm_rms_epsilon``) or LayerNorm (``layer_norm_epsilon``)."""
    rope: bool = True
    """Whether the architecture uses RoPE (GPT-2 learns absolute positions instead)."""
    norm_offset: float = 0.0
    """Added to every norm weight (Gemma's RMSNorm scales by 1 + w)."""
    transposed: tuple[str, ...] = ()
    """Suffixes of weights stored (in, out) by transformers (GPT-2's Conv1D)."""
    output: Literal["optional", "tied", "required"] = "optional"
    """llama.cpp's output layer: its own tensor or the embeddings when absent; always the
    embeddings (Gemma 2); or a tensor of its own that must be present (OLMo 2)."""
    rope_scalings: tuple[str, ...] = ()
    """RoPE scaling types beyond linear that this family writes, as per-frequency factor tensors
    (:attr:`extra_tensors`): Llama 3's ``llama3``, Phi-3's ``longrope``."""
    extra_keys: ExtraKeys = field(default=_no_keys)
    extra_tensors: ExtraTensors = field(default=_no_tensors)
    language_model: str | None = None
    """For a vision-language checkpoint, the prefix of its language model's weights (renamed to
    the text-only model's ``model.``); every other weight (vision tower, projector) is left out,
    and the hyperparameters come from the config's text part."""


def _key(template: str, arch: str) -> str:
    return template.format(arch=arch)


def text_config(config: Any, spec: ArchSpec) -> Any:
    """The config holding the language model's hyperparameters (the text part of a
    vision-language config)."""
    if spec.language_model is None:
        return config
    return config.get_text_config()


def config_int(config: Any, *names: str, default: int | None = None) -> int:
    """The first of ``names`` the config sets (not None), as an int."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    if default is None:
        raise UserError(f"GGUF export: the model's config has none of {', '.join(names)}.")
    return default


def head_dim(config: Any) -> int:
    heads = int(config.num_attention_heads)
    return config_int(config, "head_dim", default=int(config.hidden_size) // heads)


def activation(config: Any) -> str | None:
    for name in ("hidden_activation", "hidden_act", "activation_function"):
        value = getattr(config, name, None)
        if value is not None:
            return str(value)
    return None


@dataclass(frozen=True)
class Rope:
    """RoPE settings of the global-attention layers, and the local base of sliding ones."""

    rope_type: str
    theta: float
    params: Mapping[str, Any]
    sliding_theta: float | None
    sliding_type: str


def rope_settings(config: Any) -> Rope:
    """RoPE settings across transformers versions: ``rope_parameters`` (per layer type for Gemma 3
    in transformers 5) or ``rope_scaling`` plus ``rope_theta`` (and Gemma 3's
    ``rope_local_base_freq``) before."""
    raw = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    raw = dict(raw)
    sliding: dict[str, Any] = {}
    if "full_attention" in raw or "sliding_attention" in raw:
        sliding = dict(raw.get("sliding_attention") or {})
        raw = dict(raw.get("full_attention") or {})
    local = getattr(config, "rope_local_base_freq", None)
    if local is not None and "rope_theta" not in sliding:
        sliding["rope_theta"] = local
    theta = float(raw.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0))
    return Rope(
        rope_type=str(raw.get("rope_type", raw.get("type", "default"))),
        theta=theta,
        params=raw,
        sliding_theta=None if "rope_theta" not in sliding else float(sliding["rope_theta"]),
        sliding_type=str(sliding.get("rope_type", sliding.get("type", "default"))),
    )


def hyperparameters(config: Any, spec: ArchSpec, n_vocab: int) -> list[KV]:
    """The ``<arch>.*`` keys llama.cpp reads to build the network: the shared ones, then the
    family's (:attr:`ArchSpec.extra_keys`). Raises :class:`UserError` for settings llama.cpp's
    graph would not reproduce."""
    import gguf

    arch = spec.gguf_arch
    llm, attn, rope_keys = gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope
    act = activation(config)
    if act is not None and act not in spec.activations:
        raise UserError(
            f"GGUF export: this model uses the activation '{act}', but llama.cpp's '{arch}' "
            f"architecture computes {' / '.join(spec.activations)}. {_CONVERT}"
        )
    heads = int(config.num_attention_heads)
    kv_heads = config_int(config, "num_key_value_heads", default=heads)
    hidden = int(config.hidden_size)
    dim = head_dim(config)
    ff = config_int(config, "intermediate_size", "n_inner", default=4 * hidden)
    kvs = [
        KV(_key(llm.CONTEXT_LENGTH, arch), int(config.max_position_embeddings), UINT32),
        KV(_key(llm.EMBEDDING_LENGTH, arch), hidden, UINT32),
        KV(_key(llm.BLOCK_COUNT, arch), int(config.num_hidden_layers), UINT32),
        KV(_key(llm.FEED_FORWARD_LENGTH, arch), ff, UINT32),
        KV(_key(attn.HEAD_COUNT, arch), heads, UINT32),
        KV(_key(attn.HEAD_COUNT_KV, arch), kv_heads, UINT32),
        KV(_key(llm.VOCAB_SIZE, arch), n_vocab, UINT32),
    ]
    if spec.norm == "rms":
        eps = float(config.rms_norm_eps)
        kvs.append(KV(_key(attn.LAYERNORM_RMS_EPS, arch), eps, FLOAT32))
    else:
        eps = float(getattr(config, "layer_norm_epsilon", None) or config.layer_norm_eps)
        kvs.append(KV(_key(attn.LAYERNORM_EPS, arch), eps, FLOAT32))
    if dim * heads != hidden:
        kvs.append(KV(_key(attn.KEY_LENGTH, arch), dim, UINT32))
        kvs.append(KV(_key(attn.VALUE_LENGTH, arch), dim, UINT32))
    if spec.rope:
        rope = rope_settings(config)
        kvs.append(KV(_key(rope_keys.FREQ_BASE, arch), rope.theta, FLOAT32))
        rotary = rope.params.get("partial_rotary_factor")
        rotary = getattr(config, "partial_rotary_factor", None) if rotary is None else rotary
        n_rot = int(dim * float(rotary)) if rotary is not None else dim
        kvs.append(KV(_key(rope_keys.DIMENSION_COUNT, arch), n_rot, UINT32))
        factor = rope.params.get("factor")
        if rope.rope_type == "linear" and factor is not None:
            kvs.append(KV(_key(rope_keys.SCALING_TYPE, arch), "linear", STRING))
            kvs.append(KV(_key(rope_keys.SCALING_FACTOR, arch), float(factor), FLOAT32))
        elif rope.rope_type == "longrope" and "longrope" in spec.rope_scalings:
            kvs.extend(_longrope_keys(config, arch, rope))
        elif rope.rope_type not in ("default", *spec.rope_scalings):
            written = ", ".join(("default", "linear", *spec.rope_scalings))
            raise UserError(
                f"GGUF export: RoPE scaling '{rope.rope_type}' is not written by grpokit's GGUF "
                f"export for the '{arch}' architecture (it writes {written}). {_CONVERT}"
            )
    kvs.extend(spec.extra_keys(config, arch))
    return kvs


# ---- family-specific keys ----------------------------------------------------------------------


def _mistral_keys(config: Any, arch: str) -> list[KV]:
    window = getattr(config, "sliding_window", None)
    if window and int(window) < int(config.max_position_embeddings):
        raise UserError(
            f"GGUF export: this Mistral model uses a sliding attention window of {int(window)} "
            f"tokens, which llama.cpp's '{arch}' architecture does not apply. {_CONVERT}"
        )
    return []


def _sliding_layers(config: Any) -> list[bool] | None:
    """Per layer, whether it attends within the sliding window; None when no layer does."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    n_layers = int(config.num_hidden_layers)
    if not window:
        return None
    if types is None:  # transformers before layer_types: Gemma 2 alternates, from layer 0
        pattern = int(getattr(config, "sliding_window_pattern", None) or 2)
        return [(i + 1) % pattern != 0 for i in range(n_layers)]
    sliding = [t == "sliding_attention" for t in types]
    return sliding if any(sliding) else None


def _gemma_attention_scale(config: Any, arch: str, big_layers: int) -> None:
    """llama.cpp scales Gemma queries by 1/sqrt(head_dim), or by 1/sqrt(hidden/heads) for the
    layer count of the 27B model; transformers by ``query_pre_attn_scalar ** -0.5``."""
    heads, hidden = int(config.num_attention_heads), int(config.hidden_size)
    expected = hidden // heads if int(config.num_hidden_layers) == big_layers else head_dim(config)
    scalar = getattr(config, "query_pre_attn_scalar", None)
    if scalar is not None and float(scalar) != float(expected):
        raise UserError(
            f"GGUF export: this model scales attention by query_pre_attn_scalar={scalar}, while "
            f"llama.cpp's '{arch}' architecture uses {expected} for a model of this shape; the "
            f"exported model would attend differently. {_CONVERT}"
        )


def _sliding_window_keys(config: Any, arch: str) -> list[KV]:
    import gguf

    sliding = _sliding_layers(config)
    if sliding is None:
        return []
    attn = gguf.Keys.Attention
    return [
        KV(_key(attn.SLIDING_WINDOW, arch), int(config.sliding_window), UINT32),
        KV(_key(attn.SLIDING_WINDOW_PATTERN, arch), sliding, ARRAY, BOOL),
    ]


def _softcap(config: Any, name: str) -> float | None:
    value = getattr(config, name, None)
    return None if value is None else float(value)


def _gemma2_keys(config: Any, arch: str) -> list[KV]:
    import gguf

    _gemma_attention_scale(config, arch, big_layers=46)
    attn_cap, final_cap = (
        _softcap(config, "attn_logit_softcapping"),
        _softcap(config, "final_logit_softcapping"),
    )
    if attn_cap is None or final_cap is None:
        # llama.cpp's gemma2 graph always soft-caps, with defaults 50 and 30 when unset.
        raise UserError(
            "GGUF export: this Gemma 2 model turns attention or final logit soft-capping off, "
            f"which llama.cpp's '{arch}' architecture always applies. {_CONVERT}"
        )
    if _sliding_layers(config) is None:
        raise UserError(
            f"GGUF export: this Gemma 2 model has no sliding-window layers, which llama.cpp's "
            f"'{arch}' architecture always has. {_CONVERT}"
        )
    llm = gguf.Keys.LLM
    return [
        KV(_key(llm.ATTN_LOGIT_SOFTCAPPING, arch), attn_cap, FLOAT32),
        KV(_key(llm.FINAL_LOGIT_SOFTCAPPING, arch), final_cap, FLOAT32),
        *_sliding_window_keys(config, arch),
    ]


def _gemma3_keys(config: Any, arch: str) -> list[KV]:
    import gguf

    _gemma_attention_scale(config, arch, big_layers=62)
    if _softcap(config, "attn_logit_softcapping") is not None:
        raise UserError(
            f"GGUF export: this Gemma 3 model soft-caps attention logits, which llama.cpp's "
            f"'{arch}' architecture does not. {_CONVERT}"
        )
    kvs = _sliding_window_keys(config, arch)
    rope = rope_settings(config)
    if kvs:
        if rope.sliding_type != "default":
            raise UserError(
                f"GGUF export: this Gemma 3 model scales RoPE ('{rope.sliding_type}') in its "
                f"sliding-window layers, which llama.cpp's '{arch}' architecture does not. "
                f"{_CONVERT}"
            )
        # llama.cpp's default local base is 10000, the Gemma 3 value; written whenever known.
        if rope.sliding_theta is not None:
            key = _key(gguf.Keys.Rope.FREQ_BASE_SWA, arch)
            kvs.append(KV(key, rope.sliding_theta, FLOAT32))
    final_cap = _softcap(config, "final_logit_softcapping")
    if final_cap:
        kvs.append(KV(_key(gguf.Keys.LLM.FINAL_LOGIT_SOFTCAPPING, arch), final_cap, FLOAT32))
    return kvs


def _phi3_keys(config: Any, arch: str) -> list[KV]:
    import gguf

    # llama.cpp's phi3 graph reads the window but attends to the whole context (as its own
    # converter's files do): equal outputs up to the window's length.
    window = getattr(config, "sliding_window", None)
    return [KV(_key(gguf.Keys.Attention.SLIDING_WINDOW, arch), int(window or 0), UINT32)]


def _longrope_keys(config: Any, arch: str, rope: Rope) -> list[KV]:
    """LongRoPE (Phi-3): llama.cpp multiplies cos/sin by ``attn_factor`` and divides each
    frequency by the short factors up to the original context, the long ones beyond (the factor
    tensors are the scaling: as llama.cpp's converter, no scaling type is written)."""
    import gguf

    original = rope.params.get("original_max_position_embeddings") or getattr(
        config, "original_max_position_embeddings", None
    )
    if original is None or not rope.params.get("long_factor"):
        raise UserError(
            "GGUF export: this model's LongRoPE settings have no original_max_position_embeddings"
            f" or long_factor. {_CONVERT}"
        )
    factor = rope.params.get("factor") or int(config.max_position_embeddings) / int(original)
    attention = rope.params.get("attention_factor")
    if attention is None:
        attention = math.sqrt(1 + math.log(factor) / math.log(int(original))) if factor > 1 else 1.0
    keys = gguf.Keys.Rope
    return [
        KV(_key(keys.SCALING_ORIG_CTX_LEN, arch), int(original), UINT32),
        KV(_key(keys.SCALING_ATTN_FACTOR, arch), float(attention), FLOAT32),
    ]


def _longrope_tensors(config: Any) -> list[Tensor]:
    import gguf

    rope = rope_settings(config)
    if rope.rope_type != "longrope":
        return []
    n = int(head_dim(config) * float(rope.params.get("partial_rotary_factor", 1.0) or 1.0)) // 2
    out = []
    for kind, which in (("long_factor", gguf.MODEL_TENSOR.ROPE_FACTORS_LONG),
                        ("short_factor", gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT)):  # fmt: skip
        values = np.asarray(rope.params[kind], dtype=np.float32)
        if values.shape != (n,):
            raise UserError(
                f"GGUF export: the LongRoPE {kind} has {values.size} values; this model's "
                f"rotary dimensions need {n}. {_CONVERT}"
            )
        out.append(Tensor(gguf.TENSOR_NAMES[which] + ".weight", values))
    return out


def llama3_rope_factors(
    inv_freq: np.ndarray,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_context: int,
) -> np.ndarray:
    """Llama 3's RoPE scaling as a divisor of each frequency (llama.cpp's ``rope_freqs``).

    Wavelengths shorter than ``original_context / high_freq_factor`` keep their frequency,
    those longer than ``original_context / low_freq_factor`` are divided by ``factor``, and in
    between the divisor moves smoothly from ``factor`` to 1 (Meta's reference code).

    Args:
        inv_freq: (n_rot / 2,) unscaled RoPE frequencies, base ** (-2i / n_rot).

    Returns:
        (n_rot / 2,) float32 divisors.
    """
    wavelength = 2 * math.pi / inv_freq
    smooth = (original_context / wavelength - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    between = 1 / ((1 - smooth) / factor + smooth)
    divisors = np.where(wavelength < original_context / high_freq_factor, 1.0, between)
    divisors = np.where(wavelength > original_context / low_freq_factor, factor, divisors)
    return divisors.astype(np.float32)


def _llama3_tensors(config: Any) -> list[Tensor]:
    import gguf

    rope = rope_settings(config)
    if rope.rope_type != "llama3":
        return []
    dim = head_dim(config)
    inv_freq = 1.0 / rope.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    divisors = llama3_rope_factors(
        inv_freq,
        float(rope.params["factor"]),
        float(rope.params["low_freq_factor"]),
        float(rope.params["high_freq_factor"]),
        int(rope.params["original_max_position_embeddings"]),
    )
    return [Tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", divisors)]


def _smollm3_keys(config: Any, arch: str) -> list[KV]:
    """llama.cpp's smollm3 graph leaves RoPE out of every 4th layer (layers 3, 7, ...)."""
    n_layers = int(config.num_hidden_layers)
    expected = [int((i + 1) % 4 != 0) for i in range(n_layers)]
    given = [int(x) for x in getattr(config, "no_rope_layers", None) or [1] * n_layers]
    if given != expected:
        raise UserError(
            f"GGUF export: this SmolLM3 model uses RoPE in the layers {given} (1 = with RoPE), "
            f"while llama.cpp's '{arch}' architecture leaves it out of every 4th layer. {_CONVERT}"
        )
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        raise UserError(
            f"GGUF export: this SmolLM3 model attends within a sliding window, which llama.cpp's "
            f"'{arch}' architecture does not. {_CONVERT}"
        )
    return []


def _gpt2_keys(config: Any, arch: str) -> list[KV]:
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) or not getattr(
        config, "scale_attn_weights", True
    ):
        raise UserError(
            "GGUF export: this GPT-2 model scales attention other than by 1/sqrt(head size) "
            f"(scale_attn_by_inverse_layer_idx or scale_attn_weights), which llama.cpp's '{arch}' "
            f"architecture does not. {_CONVERT}"
        )
    return []


# ggml's GELU is the tanh approximation: transformers' gelu_new / gelu_pytorch_tanh.
_GELU_TANH = ("gelu_pytorch_tanh", "gelu_new")

ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec(
        "llama", reorder_rope_rows=True, rope_scalings=("llama3",), extra_tensors=_llama3_tensors
    ),
    "MistralForCausalLM": ArchSpec("llama", reorder_rope_rows=True, extra_keys=_mistral_keys),
    "SmolLM3ForCausalLM": ArchSpec("smollm3", reorder_rope_rows=True, extra_keys=_smollm3_keys),
    "Qwen2ForCausalLM": ArchSpec("qwen2"),
    "Qwen3ForCausalLM": ArchSpec("qwen3"),
    "GemmaForCausalLM": ArchSpec("gemma", activations=_GELU_TANH, norm_offset=1.0, output="tied"),
    "Gemma2ForCausalLM": ArchSpec(
        "gemma2", activations=_GELU_TANH, norm_offset=1.0, output="tied", extra_keys=_gemma2_keys
    ),
    "Gemma3ForCausalLM": ArchSpec(
        "gemma3", activations=_GELU_TANH, norm_offset=1.0, extra_keys=_gemma3_keys
    ),
    "Gemma3ForConditionalGeneration": ArchSpec(
        "gemma3",
        activations=_GELU_TANH,
        norm_offset=1.0,
        extra_keys=_gemma3_keys,
        language_model="model.language_model.",
    ),
    "Phi3ForCausalLM": ArchSpec(
        "phi3", rope_scalings=("longrope",), extra_keys=_phi3_keys, extra_tensors=_longrope_tensors
    ),
    "GPT2LMHeadModel": ArchSpec(
        "gpt2",
        activations=_GELU_TANH,
        norm="layer",
        rope=False,
        transposed=(
            "attn.c_attn.weight",
            "attn.c_proj.weight",
            "mlp.c_fc.weight",
            "mlp.c_proj.weight",
        ),  # fmt: skip
        extra_keys=_gpt2_keys,
    ),
    "Olmo2ForCausalLM": ArchSpec("olmo2", output="required"),
}
"""transformers class -> llama.cpp mapping; the families grpokit's GGUF export writes."""


def arch_spec(config: Any) -> ArchSpec:
    """The mapping for a transformers config, or :class:`UserError` naming the architecture."""
    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    shown = ", ".join(names) or getattr(config, "model_type", "unknown")
    raise UserError(
        f"GGUF export does not map the architecture {shown}; it maps "
        f"{', '.join(sorted(ARCHITECTURES))}. {_CONVERT}"
    )


# ---- tensors -----------------------------------------------------------------------------------


def rotate_pairs_layout(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder q or k projection rows from rotate-half to rotate-pairs layout.

    Args:
        weight: (n_heads * d, ...) rows of a q/k projection (a weight or a bias), d even; within
            a head, transformers pairs row j with row j + d/2.
        n_heads: heads of this projection (key/value heads for k).

    Returns:
        The same shape, with each head's rows ordered 0, d/2, 1, d/2 + 1, ... so that the pairs
        llama.cpp rotates together (2i, 2i + 1) are the pairs transformers rotates together.
    """
    rows = weight.shape[0]
    half = rows // n_heads // 2
    return (
        weight.reshape(n_heads, 2, half, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
        .contiguous()
    )


def _name_map(spec: ArchSpec, n_blocks: int) -> Any:
    import gguf

    by_name = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
    return gguf.get_tensor_name_map(by_name[spec.gguf_arch], n_blocks)


def _skipped(hf_name: str) -> bool:
    """Buffers that are not weights (RoPE frequencies, GPT-2's causal mask)."""
    return hf_name.endswith(("rotary_emb.inv_freq", "rotary_emb.original_inv_freq",
                             ".attn.bias", ".attn.masked_bias"))  # fmt: skip


def gguf_tensors(
    state_dict: Mapping[str, torch.Tensor], config: Any, spec: ArchSpec
) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) for every tensor llama.cpp needs, in state-dict order, then the
    family's extra tensors.

    The array shapes are the PyTorch ones ((out, in) for linear layers), which is how the gguf
    writer expects them. Raises :class:`UserError` for a weight without a llama.cpp name.
    """
    names = _name_map(spec, int(config.num_hidden_layers))
    heads = int(config.num_attention_heads)
    kv_heads = config_int(config, "num_key_value_heads", default=heads)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if spec.output == "tied" and not tied:
        raise UserError(
            f"GGUF export: this model has an output layer of its own, but llama.cpp's "
            f"'{spec.gguf_arch}' architecture always reuses the embeddings. {_CONVERT}"
        )
    for hf_name, tensor in state_dict.items():
        if spec.language_model is not None and hf_name != "lm_head.weight":
            if not hf_name.startswith(spec.language_model):
                continue  # the vision tower and projector: llama.cpp keeps them in another file
            hf_name = "model." + hf_name.removeprefix(spec.language_model)
        if _skipped(hf_name) or (tied and hf_name == "lm_head.weight"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise UserError(
                f"GGUF export: the weight '{hf_name}' has no llama.cpp name for the "
                f"'{spec.gguf_arch}' architecture; this model variant is not supported. Export "
                "with --format hf instead."
            )
        value = tensor.detach().to(device="cpu", dtype=torch.float32)
        if hf_name.endswith(spec.transposed):
            value = value.t().contiguous()
        if spec.norm_offset and "norm" in name and name.endswith(".weight"):
            value = value + spec.norm_offset
        if spec.reorder_rope_rows and ".attn_q." in name:
            value = rotate_pairs_layout(value, heads)
        elif spec.reorder_rope_rows and ".attn_k." in name:
            value = rotate_pairs_layout(value, kv_heads)
        yield name, value.numpy()
        if tied and spec.output == "required" and name == "token_embd.weight":
            yield "output.weight", value.numpy()
    for extra in spec.extra_tensors(config):
        yield extra.name, extra.array
