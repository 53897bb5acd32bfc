"""The rules that pick between the native decoder's paths, in one place, each with the
measurements it was decided on. :class:`grpokit.rollout.torch_engine.TorchEngine` asks the first
three for every rollout, the trainer's set-up (grpokit.train.setup) the last:

- :func:`blocked_products_pay`: float32 products through grpokit's blocked layout
  (:class:`~grpokit.native.fused.BlockedLinear`) or through oneDNN's prepacked weights;
- :func:`unmerged_lora_pays`: a LoRA adapter computed beside its frozen base, or merged into a
  packed copy of the weights;
- :func:`merged_lora_fits`: whether that merged copy fits the device's free memory;
- :func:`reference_rows_pay`: the reference model decoded on rows beside the policy's, or a
  reference forward in the update.

Where a rule was measured on one machine only, its docstring says so; a new measurement that
moves a threshold belongs here, with its numbers (bench/RESULTS.md holds the runs).
"""

from __future__ import annotations

import torch

from grpokit.models.compat import adapter_in_effect
from grpokit.native.decoders import base_layer
from grpokit.native.fused import decode_kernels


def blocked_products_pay() -> bool:
    """Whether ``model.cpu_matmul: auto`` decodes float32 linear layers with
    :class:`~grpokit.native.fused.BlockedLinear` here rather than with oneDNN's prepacked products: on CPUs with AVX2 and no AVX-512, where it
    was measured (an AMD EPYC of the Zen 3 generation, one thread: 1.2-1.7x oneDNN's speed over a
    decoding step's products of the embedded model at 1-8 rows, 1.16-1.31x at 32-256); CPUs with
    AVX-512 keep oneDNN, which was not compared there. Needs the kernels built."""
    return torch.backends.cpu.get_cpu_capability() == "AVX2" and decode_kernels() is not None


def unmerged_lora_pays(max_new_tokens: int, rows: int) -> bool:
    """Whether decoding ``rows`` rows of up to ``max_new_tokens`` tokens is faster with a LoRA
    adapter computed beside its frozen base (packed once for the run; a cost per step that grows
    with the rows) than merged into a freshly packed copy of the weights (a cost per rollout).

    Measured on the embedded model (r 16 on every linear layer, bfloat16, 1 thread, Intel AMX):
    merging and packing take 0.3 s a rollout; the adapter unmerged adds 4.1 ms to a step of 4
    rows and 8.8 ms to one of 32 (break-even at 73 and 33 tokens). This rule picks unmerged up to
    64 tokens at 4 rows, 48 at 8 and 19 at 32: on the safe side of both measurements.
    """
    return max_new_tokens * (1 + rows / 8) <= 96


def merged_lora_fits(model: torch.nn.Module, free_bytes: int | None) -> bool:
    """Whether a rollout may merge the LoRA adapters into a copy of the weights they adapt (the
    other side of :func:`unmerged_lora_pays`) with ``free_bytes`` of the device's memory free:
    the copy may take at most half of it, leaving the rest to the KV cache and the steps. None
    (a CPU, whose memory :func:`unmerged_lora_pays`'s measurements ran in): always.

    LoRA is picked to save memory: merged, the rollout of a 7B model in bfloat16 would hold 14 GB
    of copied weights beside the 14 GB of the model, where peft's own forward (TRL's rollout)
    holds none; unmerged, the adapters cost a few small products a step instead."""
    if free_bytes is None:
        return True
    copied = 0
    for module in model.modules():
        if adapter_in_effect(module):
            weight = base_layer(module).weight
            copied += weight.numel() * weight.element_size()
    return 2 * copied <= free_bytes


def reference_rows_pay(rows: int) -> bool:
    """Whether a rollout of ``rows`` sequences (all processes' share of one generation round on
    this one) is faster with the reference model decoded beside the policy (the static decoder's
    ``reference``) than with a reference forward in the update.

    The reference rows double the rows of each decoding step; at a few rows a step mostly reads
    the weights, so they cost less than the forward they save, which grows with the tokens.
    Measured on the embedded model (LoRA r 16 on every linear layer, float32, 1 thread, an AMD
    EPYC with AVX2, 64 tokens, two trainers taking turns on the same prompts): a step took
    0.955x (0.78-1.14, 14 steps) at 4 rows, 0.98x (0.77-1.13, 14 steps) at 8, 1.02x
    (0.88-1.14, 4 steps) at 16, where doubling the rows doubles a step's products.
    """
    return rows <= 8
