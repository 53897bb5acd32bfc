"""Generation with the training model itself, in torch, with a KV cache.

Each prompt is encoded once (a left-padded prefill of the P prompts); the cache is then repeated
n times per prompt, so a group shares its prompt's encoding. Each step runs one forward of a
single token for all live sequences (see grpokit.native.decoders for the two decoders), and
finished sequences leave the batch: their cache rows are dropped once a quarter of the rows have
finished (:data:`COMPACT_WHEN_DONE`), so late steps cost only what is still generating without
copying the cache every time one sequence ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Literal, NamedTuple

import torch

from grpokit.models.compat import eval_mode
from grpokit.models.onednn import CpuMatmul, compute_dtype
from grpokit.native.decoders import (
    Decoder,
    HFDecoder,
    PackCache,
    Packing,
    StaticLlamaDecoder,
    static_decoder_unsupported,
)
from grpokit.native.graphs import GraphedSteps
from grpokit.native.heuristics import (
    blocked_products_pay,
    merged_lora_fits,
    unmerged_lora_pays,
)
from grpokit.rollout.base import (
    EngineCapabilities,
    FinishReason,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    check_generate_args,
)
from grpokit.rollout.next_token import sample_next_tokens, token_logprobs

COMPACT_WHEN_DONE = 4
"""Finished rows are dropped from the decoder once they are at least 1 / this of its rows: each
drop copies the whole KV cache, while a finished row left in costs only its share of a step."""


def left_pad(
    prompt_ids: list[list[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad prompts into one batch.

    Returns:
        input_ids (P, L), attention_mask (P, L) int64 (0 on padding), position_ids (P, L) counting
        from 0 at each prompt's first real token (padding gets 0; it is masked anyway).
    """
    width = max(len(ids) for ids in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[row, width - len(ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids.to(device), mask.to(device), positions.to(device)


class Decoded(NamedTuple):
    """What the decoding loop returns, with B = P * n rows and T = max_completion_length.

    tokens (B, T) int64 (pad after the end); logps (B, T) float32, the sampler's log-probs;
    lengths (B,) int64; ended (B,) bool, by EOS; ref_logps (B, T) float32, the reference
    model's log-probs of the same tokens, or None (0 after the end either way).
    """

    tokens: torch.Tensor
    logps: torch.Tensor
    lengths: torch.Tensor
    ended: torch.Tensor
    ref_logps: torch.Tensor | None


def free_device_bytes(model: torch.nn.Module) -> int | None:
    """The memory a CUDA model's device can still give: what the driver reports free plus what
    PyTorch's caching allocator holds unused; None on other devices."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


@contextmanager
def lora_merged(model: torch.nn.Module) -> Iterator[None]:
    """Decode with a peft model's LoRA adapter merged into its base weights, then undo the merge:
    for transformers' own forward (the static Llama decoder merges into its own copy instead,
    and a sync to vLLM merges layer by layer as it sends, grpokit.native.decoders.merged_weight).

    An unmerged adapter adds two small matmuls and their Python dispatch to every adapted linear
    layer at every decoding step; merged, each layer is one plain matmul. Measured with
    bench/train_step.py (embedded model, all-linear LoRA): a LoRA step went from 0.84-1.10x to
    0.75-0.77x TRL's time. The frozen weights are also the reference model, and a checkpoint
    holds only the adapter, so the merge is undone exactly, by copying the original weights
    back: subtracting the delta again leaves a rounding of about 1e-7 relative per rollout in
    float32, which would make a resumed run (whose base weights load fresh) drift from an
    uninterrupted one. The copy is held only while the rollout runs.
    Models without an unmerged adapter are left alone.
    """
    merge = getattr(model, "merge_adapter", None)
    # peft's LoRA layers, found by their attributes so peft need not be imported here.
    layers: list[Any] = [
        m
        for m in model.modules()
        if hasattr(m, "merged_adapters") and hasattr(m, "get_base_layer") and not m.merged
    ]
    if not callable(merge) or not layers or any(m.disable_adapters for m in layers):
        yield
        return
    bases: list[Any] = [m.get_base_layer() for m in layers]
    saved = [b.weight.detach().clone() for b in bases]
    with torch.no_grad():
        merge()
    try:
        yield
    finally:
        with torch.no_grad():
            for layer, base, weight in zip(layers, bases, saved, strict=True):
                base.weight.copy_(weight)
                layer.merged_adapters.clear()


class TorchEngine(RolloutEngine):
    """A :class:`~grpokit.rollout.base.RolloutEngine` running a transformers (or peft) causal LM.

    Args:
        model: the policy; put in eval mode while generating, its mode restored afterwards (so it
            also works with gradient checkpointing enabled, which only disables the cache in
            training mode).
        eos_token_ids: tokens that end a completion (kept in it).
        pad_token_id: token used for left padding of prompts (never attended to).
        decoder: "auto" uses the static Llama-family decoder where it applies and transformers'
            forward elsewhere; "static" requires the former; "hf" always uses the latter.
        cpu_matmul: "torch" keeps the static decoder from packing weights; "onednn" prepacks
            them for oneDNN (see grpokit.models.onednn); "auto" does too, but decodes float32
            with grpokit's blocked product where it pays
            (grpokit.native.heuristics.blocked_products_pay).
        compute_dtype: the dtype to decode in; None takes the model's mark (bfloat16 for a
            policy loaded with ``model.dtype: auto`` on a CPU that has it, see
            grpokit.models.onednn.compute_dtype), else its weights' dtype. Sampling and the
            returned log-probs are float32 either way.
        fused_kernels: let the static decoder's step use the fused CPU kernels of
            grpokit.native.fused where they build; False keeps its eager operations (the
            benchmark's comparison; ``GRPOKIT_FUSED_DECODE=0`` does the same process-wide).
        reference_logprobs: for a LoRA policy whose reference model is its base, score the
            sampled tokens under the reference model too, as the static decoder decodes
            (see its ``reference``), into :attr:`RolloutBatch.ref_logprobs`; a rollout through
            transformers' forward leaves them None.
        cuda_graphs: let the static decoder's steps be captured once per rollout as a CUDA
            graph and replayed (grpokit.native.graphs) where it decodes on a CUDA device; on
            the CPU the same fixed-shape step runs uncaptured. Finished rows then stay in the
            batch to the end (their tokens unrecorded), since a graph's shapes are fixed. Off
            by default until whole rollouts are measured on a GPU (bench/gpu_check.sh).
        keep_packed: keep the static decoder's packed copy of frozen weights (LoRA's base)
            from one rollout to the next (:class:`~grpokit.native.decoders.PackCache`); False
            packs them afresh each rollout and frees the copy with the rollout, so that the
            update runs without it (``model.return_freed_memory``). On the AVX2-only CPUs the
            copy is float32, as large as the base: 2 GiB for a 0.5B model, held through the
            update, where a LoRA step's peak memory is.
    """

    capabilities = EngineCapabilities(reference_logprobs=True)

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_ids: list[int],
        pad_token_id: int,
        decoder: Literal["auto", "static", "hf"] = "auto",
        cpu_matmul: CpuMatmul = "auto",
        compute_dtype: torch.dtype | None = None,
        fused_kernels: bool = True,
        reference_logprobs: bool = False,
        cuda_graphs: bool = False,
        keep_packed: bool = True,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("TorchEngine needs at least one EOS token id")
        self.model = model
        self.decoder = decoder
        self.cpu_matmul = cpu_matmul
        self.compute_dtype = compute_dtype
        self.fused_kernels = fused_kernels
        self.reference_logprobs = reference_logprobs
        self.cuda_graphs = cuda_graphs
        self.pack_cache: PackCache | None = PackCache() if keep_packed else None
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id

    def sync_weights(self) -> None:
        """Nothing to do: generation reads the policy's own modules."""

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        """Sample ``n`` completions for each prompt; see :class:`RolloutBatch` for the layout."""
        check_generate_args(prompt_ids, n)
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            out = self._decode(prompt_ids, n, params, generator, device)
        lengths_cpu = out.lengths.cpu().tolist()
        tokens_cpu = out.tokens.cpu()

        def per_row(logps: torch.Tensor) -> list[torch.Tensor]:
            logps = logps.cpu()
            return [logps[b, :length].clone() for b, length in enumerate(lengths_cpu)]

        reasons: list[FinishReason] = ["eos" if e else "length" for e in out.ended.cpu().tolist()]
        return RolloutBatch(
            prompt_ids=[list(ids) for ids in prompt_ids],
            completion_ids=[
                tokens_cpu[b, :length].tolist() for b, length in enumerate(lengths_cpu)
            ],
            logprobs=per_row(out.logps),
            finish_reason=reasons,
            group_size=n,
            ref_logprobs=None if out.ref_logps is None else per_row(out.ref_logps),
        )

    def _merge_fits(self) -> bool:
        """Whether a rollout may hold a LoRA-merged copy of the weights (merged_lora_fits)."""
        return merged_lora_fits(self.model, free_device_bytes(self.model))

    def _decoder(self, prompt_width: int, max_new_tokens: int, rows: int) -> Decoder:
        """The static Llama-family decoder where it applies (and is not switched off), else
        transformers' own forward."""
        dtype = self.compute_dtype or compute_dtype(self.model)
        if self.decoder != "hf":
            why = static_decoder_unsupported(self.model, prompt_width + max_new_tokens)
            if why is None:
                pack: Packing = "none"
                if self.cpu_matmul != "torch":
                    blocked = self.cpu_matmul == "auto" and self.fused_kernels
                    pack = "blocked" if blocked and blocked_products_pay() else "onednn"
                # The reference rows read the frozen base, so the adapter stays unmerged.
                reference = self.reference_logprobs
                merge = not unmerged_lora_pays(max_new_tokens, rows) and self._merge_fits()
                return StaticLlamaDecoder(
                    self.model,
                    max_new_tokens,
                    pack=pack,
                    dtype=dtype,
                    fused=self.fused_kernels,
                    pack_cache=self.pack_cache,
                    merge_lora=not reference and merge,
                    reference=reference,
                )
            if self.decoder == "static":
                raise ValueError(f"decoder 'static' cannot run this model: {why}")
        return HFDecoder(self.model, dtype=dtype)

    def _decode(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        device: torch.device,
    ) -> Decoded:
        """The decoding loop, on the decoder that suits the rollout."""
        input_ids, mask, positions = left_pad(prompt_ids, self.pad_token_id, device)
        # The static decoder computes a LoRA adapter beside the base or merges it into its own
        # copy of the weights; transformers' forward decodes with it merged in place (a saved
        # copy of the weights), or unmerged where that copy would not fit (merged_lora_fits).
        rows = len(prompt_ids) * n
        decoder = self._decoder(input_ids.shape[1], params.max_completion_length, rows)
        # Only transformers' forward runs the modules, so only it needs eval mode (no dropout);
        # the static decoder reads the weights and applies none. Switching a model's mode walks
        # all its modules: twice a rollout, that took 2% of a LoRA step of the embedded model.
        hf = isinstance(decoder, HFDecoder)
        with (
            lora_merged(self.model) if hf and self._merge_fits() else nullcontext(),
            eval_mode(self.model) if hf else nullcontext(),
        ):
            return self._sample(
                decoder, prompt_ids, (input_ids, mask, positions), n, params, generator
            )

    def _sample(
        self,
        decoder: Decoder,
        prompt_ids: list[list[int]],
        padded: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Decoded:
        """The decoding loop over the prompts, ``padded`` as :func:`left_pad` returns them; the
        reference model's log-probs too where ``decoder`` decodes it beside the policy."""
        input_ids, mask, positions = padded
        device = input_ids.device
        limit = params.max_completion_length
        logits = decoder.prefill(input_ids, mask, positions)
        reference = isinstance(decoder, StaticLlamaDecoder) and decoder.reference

        def ref_logits() -> torch.Tensor:
            assert isinstance(decoder, StaticLlamaDecoder) and decoder.reference_logits is not None
            return decoder.reference_logits

        # Share each prompt's encoding across its group: rows i*n .. i*n+n-1 are prompt i.
        decoder.expand(n)
        graphed: GraphedSteps | None = None
        if self.cuda_graphs and isinstance(decoder, StaticLlamaDecoder):
            graphed = GraphedSteps(decoder, capture=device.type == "cuda")
        advance = graphed or decoder.step
        logits = logits.repeat_interleave(n, dim=0)
        ref = ref_logits().repeat_interleave(n, dim=0) if reference else None

        batch = logits.shape[0]
        tokens = torch.full((batch, limit), self.pad_token_id, dtype=torch.long, device=device)
        logps = torch.zeros((batch, limit), dtype=torch.float32, device=device)
        ref_logps = torch.zeros_like(logps) if reference else None
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        ended = torch.zeros(batch, dtype=torch.bool, device=device)
        stop = [] if params.ignore_eos else self.eos_token_ids
        eos = torch.tensor(stop, dtype=torch.long, device=device)
        live = torch.arange(batch, device=device)  # the decoder's rows, as batch rows
        going = torch.ones(batch, dtype=torch.bool, device=device)  # per decoder row

        seen = None  # (decoder rows, V): tokens so far, for the repetition penalty
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(logits.shape, dtype=torch.bool, device=device)
            seen.scatter_(1, input_ids.repeat_interleave(n, dim=0), True)
            seen[:, self.pad_token_id] = False  # left padding is not text
            for b, ids in enumerate(prompt_ids):  # unless the prompt itself holds that token
                if self.pad_token_id in ids:
                    seen[b * n : (b + 1) * n, self.pad_token_id] = True
        for step in range(limit):
            token, logp = sample_next_tokens(
                logits,
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                generator=generator,
                min_p=params.min_p,
                repetition_penalty=params.repetition_penalty,
                seen=seen,
            )
            if seen is not None:
                seen[torch.arange(len(token), device=device), token] = True
            # Rows that already ended stay in the decoder until compaction; nothing of theirs
            # is recorded.
            rec = live[going]
            tokens[rec, step] = token[going]
            logps[rec, step] = logp[going]
            if ref_logps is not None and ref is not None:
                ref_logps[rec, step] = token_logprobs(ref, token, params.temperature)[going]
            lengths[rec] += 1
            stopped = going & torch.isin(token, eos)
            ended[live[stopped]] = True
            going = going & ~stopped
            if step == limit - 1:
                break
            n_going = int(going.sum())
            if n_going == 0:
                break
            done = going.numel() - n_going
            if graphed is None and done * COMPACT_WHEN_DONE >= going.numel():
                keep = going.nonzero().squeeze(-1)
                decoder.select(keep)
                live, token, going = live[keep], token[keep], going[keep]
                seen = None if seen is None else seen[keep]
            logits = advance(token)
            ref = ref_logits() if reference else None
        return Decoded(tokens, logps, lengths, ended, ref_logps)
