"""The output projection computed in float32 (TRL's ``cast_lm_head_to_fp32``, ScaleRL's recipe).

In a bfloat16 model (or one computing in bfloat16 under CPU autocast) the logits carry bfloat16's
8-bit mantissa: a logit near 20 is off by up to 0.06, and so is each token's log-prob, noise in
every importance ratio and KL term. Casting the head's weights to float32 and upcasting the
hidden states before it removes that rounding at the cost of one float32 matrix product per
position. The rollout engines keep their own copy of the head (grpokit's decoder packs it in the
model's dtype, vLLM loads its own): like TRL, only the trainer's forwards change, and the gap the
sampler keeps shows in ``mismatch/*``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from grpokit.errors import UserError
from grpokit.models.compat import hf_model

__all__ = ["Float32Head", "cast_lm_head_to_fp32"]


class Float32Head(torch.nn.Linear):
    """A linear layer that computes in float32 whatever it is given, outside any autocast
    region (CPU autocast would otherwise cast it back to bfloat16). Its parameters are float32;
    the state dict and ``isinstance(m, nn.Linear)`` are those of the linear layer it was."""

    keeps_float32 = True
    """Read by grpokit.models.onednn: not to be stored in the compute dtype."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        with torch.autocast(hidden.device.type, enabled=False):
            return F.linear(hidden.float(), self.weight.float(), bias)


def cast_lm_head_to_fp32(model: torch.nn.Module) -> None:
    """Make ``model``'s output projection a :class:`Float32Head` (in place).

    A head tied to the input embedding shares its weight, which then becomes float32 too; the
    embedding's output is cast back to the model's dtype, so the rest of the network computes as
    before (TRL does the same).

    Raises:
        UserError: the head is not a plain linear layer (a LoRA adapter on it, or a model whose
            head is something else), which this cannot cast without changing what trains.
    """
    inner: Any = hf_model(model)  # a transformers model: its head and embedding getters
    head = inner.get_output_embeddings()
    if isinstance(head, Float32Head):
        return
    if not isinstance(head, torch.nn.Linear) or not hasattr(head, "weight"):
        raise UserError(
            f"training.cast_lm_head_to_fp32: {type(inner).__name__}'s output projection is a "
            f"{type(head).__name__}, not a plain linear layer (a LoRA adapter on lm_head?); "
            "remove lm_head from model.lora.target_modules, or set cast_lm_head_to_fp32: false"
        )
    dtype = head.weight.dtype
    embedding = inner.get_input_embeddings()
    tied = embedding is not None and getattr(embedding, "weight", None) is head.weight
    head.to(torch.float32)  # in place: a tied weight stays one parameter
    head.__class__ = Float32Head
    if tied and dtype != torch.float32:

        def to_model_dtype(
            module: torch.nn.Module, args: object, output: torch.Tensor
        ) -> torch.Tensor:
            return output.to(dtype)

        embedding.register_forward_hook(to_model_dtype)
