"""The model side of decoding: encode the prompts, then one forward per new token, with a KV cache.

:class:`TorchEngine` runs the same loop over either decoder here:

- :class:`StaticLlamaDecoder`, for the Llama family (Llama, Mistral, Qwen2, Qwen3 and their
  fine-tunes: SmolLM2, the embedded model, is a Llama). It computes a decoding step straight from
  the model's own modules and weights, with the KV cache preallocated for the whole rollout. Per
  token that is the linear layers plus a few small ops, where the transformers forward adds per
  layer a cache update that re-concatenates the cache, mask construction and module dispatch,
  which on a small model cost a large share of the step (bench/rollout.py compares the engine
  with transformers' generate and with the bare decode). Its step computes what lies between
  the linear layers with the fused C++ kernels of grpokit.native.fused where they are built,
  four calls per layer instead of about forty eager operations.
- :class:`HFDecoder`, transformers' own forward with a ``DynamicCache``: every other architecture.

Both are built per rollout, after a sharded model is gathered; the static decoder also packs
float32 CPU weights then: prepacked for oneDNN (grpokit.models.onednn), which more than halves a
decoding step against PyTorch's own product, or, on CPUs with AVX2 and no AVX-512, into the blocked
layout of grpokit's own float32 product, faster there again (grpokit.native.fused.BlockedLinear).
Frozen weights, LoRA's base, are packed once and kept (:class:`PackCache`). For a short rollout it
computes a LoRA adapter beside the base product, unmerged, as peft's forward does; for a long one
it merges the adapter into a copy of the weights it packs
(:func:`grpokit.native.heuristics.unmerged_lora_pays`; the transformers forward decodes with the
adapter merged into the weights in place, then restored), where that copy fits the device's free
memory (:func:`~grpokit.native.heuristics.merged_lora_fits`). With the adapter unmerged it can also
decode the reference model, the base alone, on rows of its own beside the policy's (its
``reference``): the trainer then needs no reference forward before the update. On a GPU, where a
step costs what the host spends launching its kernels, its :meth:`~StaticLlamaDecoder.fixed_step`
keeps every shape and buffer the same from token to token, so that a rollout's steps can be
replayed from one CUDA graph (grpokit.native.graphs).

Both decode in a model's compute dtype (grpokit.models.onednn.compute_dtype) as its training
forward computes under autocast: with bfloat16, the static decoder packs a bfloat16 copy of the
linear weights and keeps the KV cache in bfloat16, while norms, rotary embeddings, the softmax
and the residual stream stay float32; the transformers forward runs under CPU autocast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

import torch

from grpokit.models.compat import (
    adapter_in_effect,
    cache_kwarg,
    hf_model,
    logits_to_keep_kwarg,
    new_cache,
)
from grpokit.models.onednn import PackedLinear
from grpokit.native.fused import BlockedLinear, decode_kernels

LLAMA_FAMILY = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""``config.model_type`` values whose decoder layers are pre-norm attention + gated MLP with
rotary positions, the layout :class:`StaticLlamaDecoder` computes."""


class Decoder(Protocol):
    """What the decoding loop needs from a model.

    Rows are sequences. ``prefill`` starts P rows from left-padded prompts; ``expand`` repeats each
    row n times (the group shares its prompt's cache); ``step`` appends one token per row;
    ``select`` keeps the listed rows only. Logits are returned for the last position, (rows, V).
    """

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor: ...

    def expand(self, n: int) -> None: ...

    def step(self, token: torch.Tensor) -> torch.Tensor: ...

    def select(self, rows: torch.Tensor) -> None: ...


class HFDecoder:
    """Decoding through the model's own forward and a transformers ``DynamicCache``.

    Args:
        model: a transformers causal LM (or a peft model wrapping one).
        dtype: compute under CPU autocast to this dtype (bfloat16); None, or the weights' own
            dtype, computes in the weights' dtype.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        self.model = model
        own = next(model.parameters()).dtype
        self.dtype = dtype if dtype not in (None, own) else None
        self.cache_kwarg, self.keep_kwarg = cache_kwarg(model), logits_to_keep_kwarg(model)
        self.cache = new_cache(model)
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.next_position = torch.zeros(0, dtype=torch.long)

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": self.mask,
            "position_ids": position_ids,
            self.cache_kwarg: self.cache,
            "use_cache": True,
        }
        if self.keep_kwarg is not None:
            kwargs[self.keep_kwarg] = 1
        autocast = (
            torch.autocast("cpu", dtype=self.dtype)
            if self.dtype is not None
            else contextlib.nullcontext()
        )
        with autocast:
            logits: torch.Tensor = self.model(**kwargs).logits
        return logits[:, -1, :]

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        self.mask = attention_mask
        self.next_position = position_ids[:, -1] + 1
        return self._forward(input_ids, position_ids)

    def expand(self, n: int) -> None:
        self.cache.batch_repeat_interleave(n)
        self.mask = self.mask.repeat_interleave(n, dim=0)
        self.next_position = self.next_position.repeat_interleave(n)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=-1)
        logits = self._forward(token[:, None], self.next_position[:, None])
        self.next_position = self.next_position + 1
        return logits

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask, self.next_position = self.mask[rows], self.next_position[rows]


def _merges_out_of_place(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a peft LoRA layer whose active adapters are plain low-rank deltas
    (``get_delta_weight``; no DoRA or other variant, no adapter bias), which :class:`_LoraDelta`
    computes beside the base product."""
    return (
        callable(getattr(module, "get_delta_weight", None))
        and not getattr(module, "lora_variant", {})
        and not any(getattr(module, "lora_bias", {}).values())
    )


def base_layer(module: torch.nn.Module) -> Any:
    """The plain linear layer behind a projection (a peft layer's base layer, else itself)."""
    get_base = getattr(module, "get_base_layer", None)
    return get_base() if callable(get_base) else module


def merged_weight(module: torch.nn.Module) -> torch.Tensor:
    """A projection's base weight plus its active plain LoRA adapters' deltas, in a new tensor
    (the base weight itself where no adapter is in effect): the policy's own weights are never
    changed, so neither a rollout nor a sync to vLLM needs a saved copy of them and a copy back.
    Each delta is added in the wider of the two dtypes and rounded once to the weight's, as
    peft's in-place merge rounds."""
    base = base_layer(module)
    weight: torch.Tensor = base.weight.detach()
    if not adapter_in_effect(module):
        return weight
    lora: Any = module
    with torch.no_grad():  # the delta is made of trained parameters: no graph to keep
        for name in lora.active_adapters:
            if name in lora.lora_A:
                weight = torch.add(weight, lora.get_delta_weight(name)).to(base.weight.dtype)
    return weight


Packing = Literal["none", "onednn", "blocked"]
"""How the static decoder copies float32 CPU linear weights for its products: "onednn" prepacks
them for oneDNN (grpokit.models.onednn.PackedLinear); "blocked" copies them into the blocked
layout of grpokit's own float32 product (grpokit.native.fused.BlockedLinear) where the decoder
computes in float32, and prepacks for oneDNN in bfloat16; "none" uses the layers as they are."""

Packed = PackedLinear | BlockedLinear
"""A packed copy of linear weights (one layer, or several stacked on the output axis): called on
x (..., in), it returns (..., out)."""


def _linear(
    base: Any, weight: torch.Tensor, pack: Packing, dtype: torch.dtype, cache: PackCache | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A base linear layer computing with ``weight`` (its own, or a merged copy) as one product.
    Packed, a float32 CPU layer becomes a packed copy computing in ``dtype`` (from ``cache``
    where the weight is frozen); unpacked, a weight not in ``dtype`` (or a merged copy) computes
    as a copy in ``dtype``."""
    bias = getattr(base, "bias", None)
    if pack != "none" and PackedLinear.applies(base):
        return (
            _packed([weight], [bias], dtype, pack)
            if cache is None
            else cache.packed([weight], [bias], dtype, pack)
        )
    if weight.dtype != dtype or weight is not base.weight:
        cast = None if bias is None else bias.detach().to(dtype)
        return partial(torch.nn.functional.linear, weight=weight.detach().to(dtype), bias=cast)
    result: Callable[[torch.Tensor], torch.Tensor] = base
    return result


class PackCache:
    """Packed copies of frozen weights, kept from one rollout's decoder to the next.

    Under LoRA the base weights never change, yet each rollout would pack them again (measured
    on the embedded model, with the adapter merged into the copy as the decoder did before: 0.38
    s of a 1.2 s rollout). Weights that require grad (full fine-tuning) are packed afresh each
    time. An entry is reused while its weights are the same tensors at the same version (an
    in-place change, such as a checkpoint loaded into them, bumps it); entries a decoder did not
    use are dropped when :meth:`finish` is called, so at most one packed copy of a model is
    kept. The cost: that copy (half the float32 base model's bytes in bfloat16) stays in memory
    between rollouts instead of only during them.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], tuple[list[torch.Tensor], Packed]] = {}
        self._used: dict[tuple[Any, ...], tuple[list[torch.Tensor], Packed]] = {}

    def packed(
        self,
        weights: list[torch.Tensor],
        biases: list[torch.Tensor | None],
        dtype: torch.dtype,
        pack: Packing,
    ) -> Packed:
        """The weights (out_i, in) stacked on the output axis, with their biases (zeros where
        None, no bias where all are), packed as ``pack`` says to compute in ``dtype``."""
        tensors = [t for t in (*weights, *biases) if t is not None]
        # Trained weights change every step; an inference tensor has no version to check.
        if any(t.requires_grad or t.is_inference() for t in tensors):
            return _packed(weights, biases, dtype, pack)
        key = (tuple(id(t) for t in tensors), tuple(t._version for t in tensors), dtype, pack)
        entry = self._entries.get(key) or self._used.get(key)
        if entry is None or any(a is not b for a, b in zip(entry[0], tensors, strict=True)):
            entry = (tensors, _packed(weights, biases, dtype, pack))
        self._used[key] = entry
        return entry[1]

    def finish(self) -> None:
        """Keep only the entries used since the last call."""
        self._entries, self._used = self._used, {}


def _packed(
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None],
    dtype: torch.dtype,
    pack: Packing,
) -> Packed:
    if len(weights) == 1:
        weight = weights[0]
    else:  # cast while stacking: one pass over the float32 weights (a cat, then a cast, is two)
        rows = sum(int(w.shape[0]) for w in weights)
        weight = weights[0].new_empty((rows, *weights[0].shape[1:]), dtype=dtype)
        start = 0
        for w in weights:
            weight[start : start + int(w.shape[0])].copy_(w.detach())
            start += int(w.shape[0])
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [
                b.detach() if b is not None else weight.new_zeros(int(w.shape[0]))
                for b, w in zip(biases, weights, strict=True)
            ]
        )
    if pack == "blocked" and dtype == torch.float32:
        return BlockedLinear(weight.detach(), bias)
    return PackedLinear(weight.detach(), bias, dtype=dtype)


def blocked_bt(bt: torch.Tensor, block: int = 64) -> torch.Tensor:
    """B^T (r, n) -> (ceil(n / block), r, block): each block of outputs' columns contiguous,
    zero columns after the last output (the fused LoRA kernel's layout)."""
    r, n = bt.shape
    padded = torch.nn.functional.pad(bt, (0, -n % block))
    return padded.view(r, -1, block).transpose(0, 1).contiguous()


class _LoraDelta:
    """The plain LoRA adapters of projections that read the same input, computed beside the base
    product instead of merged into a copy of its weights: out += B(A x) * scaling per adapter, as
    peft's forward computes it (under autocast: rounded to the compute dtype after A, after B,
    after the scaling and after the sum, which merging into bfloat16 weights would not be).

    All adapters' A are one (R, in) matrix, so a step makes one product with them; each part's
    B^T (r, n) is stored flat. :attr:`kernels`: the fused CPU kernels (one call per projection,
    set by the decoder where its step uses them) or None (eager operations). :attr:`rows`: how
    many leading rows the adapters apply to (None: all), set by a decoder whose later rows are
    the reference model's (the base alone). The adapter is read once, at construction (the
    decoder is built per rollout).
    """

    def __init__(
        self, modules: list[torch.nn.Module], sizes: list[int], dtype: torch.dtype
    ) -> None:
        self.kernels: Any | None = None
        self.rows: int | None = None
        a_parts: list[torch.Tensor] = []
        bt_parts: list[torch.Tensor] = []
        blocked: list[torch.Tensor] = []
        parts: list[list[int]] = []
        scales: list[float] = []
        offset = rank = flat = 0
        for module, size in zip(modules, sizes, strict=True):
            lora: Any = module
            if adapter_in_effect(module):
                for name in lora.active_adapters:
                    if name not in lora.lora_A:
                        continue
                    a = lora.lora_A[name].weight.detach()
                    b = lora.lora_B[name].weight.detach()  # (size, r)
                    r = int(a.shape[0])
                    a_parts.append(a.to(dtype))
                    bt_parts.append(b.t().to(dtype).contiguous())
                    blocked.append(blocked_bt(bt_parts[-1]).view(-1))
                    parts.append([offset, size, rank, r, flat])
                    scales.append(float(lora.scaling[name]))
                    rank, flat = rank + r, flat + int(blocked[-1].numel())
            offset += size
        self.empty = not parts
        if self.empty:
            return
        self.a = torch.cat(a_parts)
        self.parts = torch.tensor(parts, dtype=torch.long)
        self.scales = torch.tensor(scales, dtype=torch.float64)
        self._eager = [
            (o, n, k, r, bt, s)
            for (o, n, k, r, _), bt, s in zip(parts, bt_parts, scales, strict=True)
        ]
        # The kernel's layouts (see kernels/decode.cpp): A^T with its ranks padded to a multiple
        # of 16 by zero columns; each B^T in contiguous blocks of 64 outputs.
        ranks = -(-int(self.a.shape[0]) // 16) * 16
        self.kernel_a_t = torch.cat(
            [self.a.t(), self.a.new_zeros(self.a.shape[1], ranks - int(self.a.shape[0]))], dim=1
        ).contiguous()
        self.kernel_bt = torch.cat(blocked)

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """out (rows, ..., N) += the adapters' outputs for input x (rows, ..., in), in place, on
        the leading :attr:`rows` rows; returns out."""
        whole = out
        if self.rows is not None:
            out, x = out[: self.rows], x[: self.rows]
        if self.kernels is not None:  # set only for a CPU model (StaticLlamaDecoder.fusable)
            self.kernels.lora_add(
                out, x.contiguous(), self.kernel_a_t, self.kernel_bt, self.parts, self.scales
            )
            return whole
        t = torch.nn.functional.linear(x, self.a)
        for o, n, k, r, bt, s in self._eager:
            out[..., o : o + n] += torch.matmul(t[..., k : k + r], bt) * s
        return whole


class _Projections:
    """Linear layers that read the same input (q, k, v; gate, up; or one layer alone), as one
    product where they are packed: one call instead of several per decoding step (90 oneDNN
    calls fewer per step on the embedded model's 30 layers; at batch 8 a call costs more in
    dispatch than the bandwidth of the smaller weights). Plain LoRA adapters add their share
    after the base product (:class:`_LoraDelta`), or with ``merge_lora`` are merged into a copy
    of the weights (see grpokit.native.heuristics)."""

    def __init__(
        self,
        modules: list[torch.nn.Module],
        pack: Packing,
        dtype: torch.dtype,
        cache: PackCache | None = None,
        merge_lora: bool = False,
    ) -> None:
        bases = [base_layer(m) for m in modules]
        self.sizes = [int(b.weight.shape[0]) for b in bases]
        merge = merge_lora and any(adapter_in_effect(m) for m in modules)
        # A merged copy is new every rollout: nothing to keep.
        cache = None if merge else cache
        weights = [
            merged_weight(m) if merge else b.weight for m, b in zip(modules, bases, strict=True)
        ]
        self.fused: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.layers: list[Callable[[torch.Tensor], torch.Tensor]] = []
        if len(bases) == 1:
            self.fused = _linear(bases[0], weights[0], pack, dtype, cache)
        elif pack != "none" and all(PackedLinear.applies(b) for b in bases):
            biases = [getattr(b, "bias", None) for b in bases]
            packer = _packed if cache is None else cache.packed
            self.fused = packer(weights, biases, dtype, pack)
        else:
            self.layers = [
                _linear(b, w, pack, dtype, cache) for b, w in zip(bases, weights, strict=True)
            ]
        self.lora = _LoraDelta([] if merge else modules, [] if merge else self.sizes, dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) -> the layers' outputs side by side, (..., sum of out_i)."""
        if self.fused is not None:
            out = self.fused(x)
        else:
            out = torch.cat([layer(x) for layer in self.layers], dim=-1)
        return out if self.lora.empty else self.lora.add_to(out, x)

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x (..., in) -> one (..., out_i) per layer (views of one result)."""
        return list(torch.split(self(x), self.sizes, dim=-1))


@dataclass(frozen=True, slots=True)
class LlamaLayer:
    """One decoder layer of a Llama-family model as :class:`StaticLlamaDecoder` computes it:
    pre-norm attention, then a pre-norm gated MLP, each added to the residual stream. The norms
    and the activation are the model's own modules (transformers' RMSNorm: ``weight`` and
    ``variance_epsilon``); the projections are the decoder's copies of its linear layers."""

    input_norm: Any
    """RMSNorm before attention (``input_layernorm``)."""
    qkv: _Projections
    """The query, key and value projections, as one product."""
    o_proj: _Projections
    """Attention's output projection."""
    q_norm: Any
    """RMSNorm of each head's query before the rotary embedding (Qwen3); None elsewhere."""
    k_norm: Any
    """The same of each head's key (Qwen3); None where ``q_norm`` is."""
    post_norm: Any
    """RMSNorm before the MLP (``post_attention_layernorm``)."""
    gate_up: _Projections
    """The MLP's gate and up projections, as one product."""
    down: _Projections
    """The MLP's down projection."""
    act: Any
    """The MLP's activation of the gate (``mlp.act_fn``)."""

    @property
    def projections(self) -> tuple[_Projections, ...]:
        """The layer's linear layers, in the order they compute."""
        return (self.qkv, self.o_proj, self.gate_up, self.down)


def static_decoder_unsupported(model: torch.nn.Module, total_length: int) -> str | None:
    """Why :class:`StaticLlamaDecoder` cannot decode ``model`` (None when it can).

    Args:
        total_length: the longest prompt plus the completion limit, in tokens.
    """
    inner = hf_model(model)
    config = getattr(inner, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in LLAMA_FAMILY:
        return f"model_type {model_type!r} is not one of {sorted(LLAMA_FAMILY)}"
    body = getattr(inner, "model", None)
    if body is None or not hasattr(body, "layers") or not hasattr(body, "rotary_emb"):
        return "the model has no .model.layers / .model.rotary_emb"
    window = getattr(config, "sliding_window", None)
    if window is not None and total_length > int(window):
        return f"sequences of {total_length} tokens exceed the sliding window of {window}"
    if any(adapter_in_effect(m) and not _merges_out_of_place(m) for m in inner.modules()):
        return "an adapter other than plain LoRA is active and not merged into the base weights"
    return None


class StaticLlamaDecoder:
    """Llama-family decoding from the model's modules, with a preallocated KV cache.

    The cache holds, per layer, keys (rows, kv_heads, head_dim, width) and values (rows, kv_heads,
    width, head_dim) for ``width = prompt width + max_new_tokens`` columns. Prompts are
    left-padded, so every row writes its next token to the same column; a padding bias
    (rows, width) hides the pad columns. Keys are stored after the rotary embedding, as in
    transformers, and transposed: the first ``upto`` columns are then a plain strided matrix for a
    step's product with the query (a bfloat16 product copies a transposed slice first, measured
    2.4x slower at batch 32).

    Args:
        model: a transformers Llama-family causal LM (see :func:`static_decoder_unsupported`).
        max_new_tokens: columns reserved after the prompt.
        pack: how to copy float32 CPU linear weights for the products (:data:`Packing`): a
            snapshot of the weights, taken here, so build a new decoder after they change.
        dtype: the linear layers' and the KV cache's dtype (None: the weights' own); bfloat16
            with float32 weights computes as the training forward does under CPU autocast.
        fused: compute a step's operations between the linear layers with the fused CPU kernels
            of grpokit.native.fused where they apply (see :meth:`fusable`); False keeps the
            eager operations. The prefill is eager either way (LoRA's shares aside).
        pack_cache: where packed copies of frozen weights are kept between decoders (the
            engine's own); None packs everything afresh.
        merge_lora: merge a plain LoRA adapter into a copy of the weights it packs, instead of
            computing it beside the base products (see grpokit.native.heuristics).
        reference: also decode the reference model of a LoRA policy, its base weights with the
            adapter off, on rows of its own that take the policy's tokens: each call's logits
            are then the policy's, and :attr:`reference_logits` the reference model's at the
            same positions. The two share each step's reads of the frozen weights, which is
            what a step with few rows spends its time on. Needs the adapter unmerged.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        max_new_tokens: int,
        *,
        pack: Packing,
        dtype: torch.dtype | None = None,
        fused: bool = True,
        pack_cache: PackCache | None = None,
        merge_lora: bool = False,
        reference: bool = False,
    ) -> None:
        if reference and merge_lora:
            raise ValueError("the reference rows need the LoRA adapter unmerged")
        inner: Any = hf_model(model)
        self.config: Any = inner.config
        body: Any = inner.model
        self.embed = body.embed_tokens
        self.rotary = body.rotary_emb
        self.final_norm = body.norm
        self.dtype: torch.dtype = dtype or self.embed.weight.dtype
        projections = partial(
            _Projections, pack=pack, dtype=self.dtype, cache=pack_cache, merge_lora=merge_lora
        )
        self.lm_head = projections([inner.lm_head])
        self.layers: list[LlamaLayer] = [
            LlamaLayer(
                input_norm=layer.input_layernorm,
                qkv=projections([getattr(layer.self_attn, f"{p}_proj") for p in ("q", "k", "v")]),
                o_proj=projections([layer.self_attn.o_proj]),
                q_norm=getattr(layer.self_attn, "q_norm", None),
                k_norm=getattr(layer.self_attn, "k_norm", None),
                post_norm=layer.post_attention_layernorm,
                gate_up=projections([layer.mlp.gate_proj, layer.mlp.up_proj]),
                down=projections([layer.mlp.down_proj]),
                act=layer.mlp.act_fn,
            )
            for layer in body.layers
        ]
        if pack_cache is not None:
            pack_cache.finish()
        attn = body.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.scaling = float(attn.scaling)
        self.n_heads = int(self.config.num_attention_heads)
        self.n_kv = int(self.config.num_key_value_heads)
        self.max_new_tokens = max_new_tokens
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.pad_bias = torch.zeros(0, 0)
        self.next_position = torch.zeros(0, dtype=torch.long)
        self.column = 0
        self.column_index = torch.zeros(1, dtype=torch.long)  # see begin_fixed_steps
        self._width_index = torch.zeros(0, dtype=torch.long)
        self.kernels = decode_kernels() if fused and self.fusable() else None
        self.reference = reference
        self.reference_logits: torch.Tensor | None = None
        self._adapters: list[_LoraDelta] = []
        # The LoRA shares follow the step's choice: one kernel call each, or eager operations.
        for part in (self.lm_head, *(part for layer in self.layers for part in layer.projections)):
            part.lora.kernels = self.kernels
            self._adapters.append(part.lora)

    def fusable(self) -> bool:
        """Whether the fused kernels compute this model's step: on CPU, with a float32 residual
        stream and norm weights (the kernels' layout), a compute dtype of float32 or bfloat16,
        and the SiLU-gated MLP."""
        norms = [self.final_norm] + [
            n
            for layer in self.layers
            for n in (layer.input_norm, layer.q_norm, layer.k_norm, layer.post_norm)
            if n
        ]
        return (
            self.embed.weight.device.type == "cpu"
            and self.embed.weight.dtype == torch.float32
            and all(n.weight.dtype == torch.float32 for n in norms)
            and self.dtype in (torch.float32, torch.bfloat16)
            and getattr(self.config, "hidden_act", None) in ("silu", "swish")
        )

    def _rms_norm(self, norm: Any, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm as transformers computes it (in float32, weight applied in the input dtype),
        in the compute dtype, as the linear layer it feeds receives it under autocast."""
        normed = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon)
        out: torch.Tensor = norm.weight * normed.to(x.dtype)
        return out.to(self.dtype)

    def _rotary(
        self, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of ``positions`` (rows, S) -> (rows, S, d), float32, the sin signed as
        rotate_half needs it: its first half negated (see :meth:`_rotate`)."""
        cos, sin = self.rotary(hidden, positions)
        half = self.head_dim // 2
        return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """The rotary embedding, x cos + rotate_half(x) sin: rotate_half(x) is x with its halves
        swapped (a roll) and the first half negated, which ``signed_sin`` carries."""
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin

    def _layers(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        attend: Any,
        column: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run every decoder layer on ``hidden`` (rows, S, H) at ``positions`` (rows, S); new
        keys and values go to columns ``self.column .. self.column + S``, or with ``column`` (a
        (1,) tensor, S = 1) to the column it holds, which the caller then advances;
        ``attend(i, q)`` maps queries (rows, heads, S, d) of layer i to its attention output of
        the same shape."""
        rows, s, _ = hidden.shape
        cos, sin = self._rotary(hidden, positions)  # (rows, S, d)
        # Rotated in float32 (the residual stream's dtype), as transformers does under autocast:
        # rotating in bfloat16 rounds three times where this rounds once, and measured on the
        # embedded model doubled the largest log-prob difference to the training forward.
        cos, sin = cos[:, None], sin[:, None]
        end = self.column + s
        for i, layer in enumerate(self.layers):
            q, k, v = layer.qkv.split(self._rms_norm(layer.input_norm, hidden))
            q = q.view(rows, s, self.n_heads, self.head_dim)
            k = k.view(rows, s, self.n_kv, self.head_dim)
            if layer.q_norm is not None:  # Qwen3 normalises each head's query and key
                q, k = layer.q_norm(q), layer.k_norm(k)
            q = self._rotate(q.transpose(1, 2), cos, sin).to(self.dtype)
            k = self._rotate(k.transpose(1, 2), cos, sin)
            k, v = k.transpose(-1, -2), v.view(rows, s, self.n_kv, self.head_dim).transpose(1, 2)
            if column is None:
                self.keys[i][..., self.column : end] = k
                self.values[i][:, :, self.column : end] = v
            else:  # a column held in a tensor: the same kernel whichever column it is
                self.keys[i].index_copy_(3, column, k.to(self.dtype))
                self.values[i].index_copy_(2, column, v.to(self.dtype))
            out = attend(i, q).transpose(1, 2).reshape(rows, s, self.n_heads * self.head_dim)
            hidden = hidden + layer.o_proj(out)
            gate, up = layer.gate_up.split(self._rms_norm(layer.post_norm, hidden))
            hidden = hidden + layer.down(layer.act(gate) * up)
        if column is None:
            self.column = end
        return hidden

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (rows, V), float32, of the last position of ``hidden`` (rows, S, H)."""
        logits: torch.Tensor = self.lm_head(self._rms_norm(self.final_norm, hidden[:, -1]))
        return logits.float()

    def _policy_rows(self, rows: int) -> None:
        """With reference rows, the adapters apply to the first ``rows`` rows only."""
        for adapter in self._adapters:
            adapter.rows = rows if self.reference else None

    def _split(self, logits: torch.Tensor) -> torch.Tensor:
        """The policy's logits; the reference rows' go to :attr:`reference_logits`."""
        if not self.reference:
            return logits
        half = logits.shape[0] // 2
        self.reference_logits = logits[half:]
        return logits[:half]

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        self._policy_rows(input_ids.shape[0])
        if self.reference:  # rows P .. 2P - 1: the same prompts, for the reference model
            input_ids, attention_mask, position_ids = (
                torch.cat([t, t]) for t in (input_ids, attention_mask, position_ids)
            )
        rows, width = input_ids.shape
        hidden = self.embed(input_ids)
        cache_shape = (rows, self.n_kv, width + self.max_new_tokens, self.head_dim)
        keys_shape = (rows, self.n_kv, self.head_dim, cache_shape[2])
        self.keys = [hidden.new_zeros(keys_shape, dtype=self.dtype) for _ in self.layers]
        self.values = [hidden.new_zeros(cache_shape, dtype=self.dtype) for _ in self.layers]
        real = attention_mask.bool()
        self.pad_bias = hidden.new_zeros((rows, cache_shape[2]))
        self.pad_bias[:, :width].masked_fill_(~real, float("-inf"))
        self.next_position = position_ids[:, -1] + 1
        self.column = 0
        # Causal over real keys; a padding query also sees itself, so its softmax (never used)
        # has a finite row instead of NaN.
        causal = torch.ones(width, width, dtype=torch.bool, device=real.device).tril()
        allowed = (causal & real[:, None, :]) | torch.eye(
            width, dtype=torch.bool, device=real.device
        )
        allowed = allowed[:, None]  # (rows, 1, S, S)

        def attend(i: int, q: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(
                q,
                self.keys[i][..., :width].transpose(-1, -2),
                self.values[i][:, :, :width],
                attn_mask=allowed,
                scale=self.scaling,
                enable_gqa=True,
            )

        return self._split(self._logits(self._layers(hidden, position_ids, attend)))

    def expand(self, n: int) -> None:
        # Policy rows then reference rows stay in that order: row i becomes rows i*n .. i*n+n-1.
        self._policy_rows(self.next_position.shape[0] // (2 if self.reference else 1) * n)
        self.keys = [k.repeat_interleave(n, dim=0) for k in self.keys]
        self.values = [v.repeat_interleave(n, dim=0) for v in self.values]
        self.pad_bias = self.pad_bias.repeat_interleave(n, dim=0)
        self.next_position = self.next_position.repeat_interleave(n)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        if self.reference:  # the reference rows score the policy's tokens
            token = torch.cat([token, token])
        if self.kernels is not None:
            return self._split(self._fused_step(token))
        return self._split(self._eager_step(token))

    def _eager_step(self, token: torch.Tensor) -> torch.Tensor:
        """:meth:`step` in eager operations, over all the decoder's rows."""
        upto = self.column + 1
        attend = self._one_query_attention(token.shape[0], self.pad_bias[:, :upto], upto)
        hidden = self.embed(token[:, None])
        hidden = self._layers(hidden, self.next_position[:, None], attend)
        self.next_position = self.next_position + 1
        return self._logits(hidden)

    def _one_query_attention(
        self, rows: int, bias: torch.Tensor, upto: int
    ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """A step's ``attend`` for :meth:`_layers`: one query per row against the cache's first
        ``upto`` columns, ``bias`` (rows, upto) added to the scores. Heads sharing a key/value
        head are one matmul against it."""
        groups = self.n_heads // self.n_kv
        bias = bias[:, None, None, :]  # (rows, 1, 1, upto)

        def attend(i: int, q: torch.Tensor) -> torch.Tensor:
            q = q.reshape(rows, self.n_kv, groups, self.head_dim)
            scores = torch.matmul(q, self.keys[i][..., :upto])
            scores = scores * self.scaling + bias
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(weights, self.values[i][:, :, :upto])
            return out.reshape(rows, self.n_heads, 1, self.head_dim)

        return attend

    def begin_fixed_steps(self) -> None:
        """Hold the next cache column in a tensor (:attr:`column_index`), for :meth:`fixed_step`;
        call it after the prefill and any :meth:`step`, before the first fixed step."""
        device = self.pad_bias.device
        self.column_index = torch.tensor([self.column], dtype=torch.long, device=device)
        self._width_index = torch.arange(self.pad_bias.shape[1], device=device)
        self.next_position = self.next_position.clone()  # advanced in place from here on

    def fixed_step(self, token: torch.Tensor) -> torch.Tensor:
        """:meth:`step` in eager operations whose shapes and buffers stay the same from one
        token to the next, so that one capture as a CUDA graph replays every step of a rollout
        (grpokit.native.graphs): the new keys and values go to the column that
        :attr:`column_index` holds, attention reads the cache's whole width with the columns
        not yet written masked out, and the column and :attr:`next_position` advance in place.
        :attr:`column` (the Python count) is the caller's to advance. Rows cannot be dropped
        (:meth:`select`) between fixed steps. See :meth:`begin_fixed_steps`."""
        if self.reference:
            token = torch.cat([token, token])
        column = self.column_index
        unwritten = self._width_index > column  # (width,): the columns after this token's
        bias = self.pad_bias.masked_fill(unwritten, float("-inf"))
        attend = self._one_query_attention(token.shape[0], bias, self.pad_bias.shape[1])
        hidden = self.embed(token[:, None])
        hidden = self._layers(hidden, self.next_position[:, None], attend, column=column)
        self.next_position.add_(1)
        column.add_(1)
        return self._split(self._logits(hidden))

    def _fused_step(self, token: torch.Tensor) -> torch.Tensor:
        """:meth:`step` with the fused kernels: per layer, the norm (with the residual add before
        it), the rotary embedding with the cache write, attention over the cache and the gated
        activation are one call each, between the same linear layers."""
        kernels: Any = self.kernels
        bf16 = self.dtype == torch.bfloat16
        hidden = self.embed(token)  # (rows, H) float32, updated in place by add_rms_norm
        cos, sin = self._rotary(hidden, self.next_position[:, None])  # (rows, 1, d)
        upto = self.column + 1
        pending: torch.Tensor | None = None  # the last layer's output, added before its norm
        for i, layer in enumerate(self.layers):
            norm1, norm2 = layer.input_norm, layer.post_norm
            q_norm, k_norm = layer.q_norm, layer.k_norm
            x = kernels.add_rms_norm(hidden, pending, norm1.weight, norm1.variance_epsilon, bf16)
            q = kernels.rope_cache(
                layer.qkv(x),
                cos,
                sin,
                self.keys[i],
                self.values[i],
                self.column,
                self.n_heads,
                None if q_norm is None else q_norm.weight,
                None if k_norm is None else k_norm.weight,
                1e-6 if q_norm is None else q_norm.variance_epsilon,
            )
            attended = kernels.decode_attention(
                q, self.keys[i], self.values[i], self.pad_bias, upto, self.scaling
            )
            x = kernels.add_rms_norm(
                hidden, layer.o_proj(attended), norm2.weight, norm2.variance_epsilon, bf16
            )
            pending = layer.down(kernels.silu_mul(layer.gate_up(x)))
        self.column = upto
        self.next_position = self.next_position + 1
        norm = self.final_norm
        logits: torch.Tensor = self.lm_head(
            kernels.add_rms_norm(hidden, pending, norm.weight, norm.variance_epsilon, bf16)
        )
        return logits.float()

    def select(self, rows: torch.Tensor) -> None:
        if self.reference:  # each kept policy row keeps its reference row
            self._policy_rows(rows.shape[0])
            rows = torch.cat([rows, rows + self.next_position.shape[0] // 2])
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.pad_bias, self.next_position = self.pad_bias[rows], self.next_position[rows]
