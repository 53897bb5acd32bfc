"""Linear layers through oneDNN on CPU: the same float32 arithmetic, a faster library; and
bfloat16 compute on CPUs that have it.

PyTorch's CPU build runs ``nn.Linear`` (and its backward) through MKL's sgemm. On CPUs where MKL
does not pick its fastest code path (it did not on this project's AMD EPYC development machine
with AVX-512), oneDNN, which ships inside the same PyTorch build and chooses its kernels by the
instruction set alone, is much faster for the same float32 product (about twice, at
SmolLM2-135M's shapes there; bench/rollout.py and bench/train_step.py measure it against the stock
path). On a CPU with AVX2 and no AVX-512 (an AMD EPYC of the Zen 3 generation) it was the other
way round for training: MKL's AVX2 products made a LoRA update of the embedded model 0.69x as long
as oneDNN's (median of 7 paired updates on the same prompts, 0.64-0.78; full fine-tuning 0.91x,
0.82-0.97); decoding's few rows go faster through oneDNN's prepacked
weights than through MKL there (a 49k x 576 output layer at 4 rows: 10.4 against 20.6 ms), and
faster again through grpokit's own blocked product (grpokit.native.fused.BlockedLinear). So
``cpu_matmul: auto`` takes oneDNN for training products only where the CPU has AVX-512
(:func:`onednn_training_pays`), and for decoding where the blocked product was not measured to
be faster.
Results agree with MKL's to float32 rounding (accumulation order differs).

Two ways in:

- :func:`use_onednn_linears` turns a model's ``nn.Linear`` layers into :class:`OneDNNLinear`
  (same parameters and state dict; forward and backward through oneDNN for float32 CPU inputs,
  unchanged otherwise). Training, reference and evaluation forwards use it.
- :class:`PackedLinear` holds one layer's weight reordered into oneDNN's blocked layout, for
  decoding, where the same weight is applied to a few rows hundreds of times between optimizer
  steps; packing happens once per rollout.

bfloat16 compute (``model.dtype: auto`` on a CPU with AVX512-BF16 or AMX, see
:func:`cpu_bf16_native`): the weights stay float32 (the optimizer's master copy) and the model is
marked with :func:`set_compute_dtype`. Training forwards then run under CPU autocast
(:func:`compute_autocast`), where a linear layer casts its input and weight to bfloat16 (cached
for the autocast region) and oneDNN's bf16 kernels compute the product with float32 accumulation;
decoding packs a bfloat16 copy of the weights (``PackedLinear(..., dtype=torch.bfloat16)``), half
the bytes a decoding step reads.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch

from grpokit.errors import UserError
from grpokit.models.compat import hf_model, is_checkpointing

CpuMatmul = Literal["auto", "onednn", "torch"]


def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN and the linear ops used here."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_linear_pointwise") and hasattr(ops, "_reorder_linear_weight")


def onednn_training_pays() -> bool:
    """Whether ``cpu_matmul: auto`` computes training and evaluation products through oneDNN
    here: on CPUs with AVX-512, not on those with AVX2 at most (see the module's docstring)."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX tiles), so that oneDNN's
    bf16 kernels run at about twice the float32 rate; elsewhere bf16 is emulated and slower."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def bf16_compute_applies(device: torch.device, mode: CpuMatmul = "auto") -> bool:
    """Whether ``model.dtype: auto`` computes in bfloat16 here: on a CPU with native bf16 and
    oneDNN, unless ``cpu_matmul: torch`` keeps PyTorch's default float32 path."""
    return device.type == "cpu" and mode != "torch" and onednn_available() and cpu_bf16_native()


_COMPUTE_DTYPE = "grpokit_compute_dtype"


def set_compute_dtype(model: torch.nn.Module, dtype: torch.dtype | None) -> None:
    """Mark ``model`` (and copies made of it later) to compute its linear layers in ``dtype``
    while its weights keep their own dtype; None removes the mark."""
    setattr(hf_model(model), _COMPUTE_DTYPE, dtype)


def compute_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype ``model`` was marked to compute in (None: its weights' own)."""
    dtype = getattr(hf_model(model), _COMPUTE_DTYPE, None)
    return dtype if isinstance(dtype, torch.dtype) else None


_frozen_casts: dict[int, tuple[torch.Tensor, int, torch.Tensor]] | None = None
"""Inside :func:`compute_autocast`: id(frozen weight) -> (weight, its version, its cast), see
:func:`_frozen_cast`."""

_kept_casts: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
"""Inside :func:`frozen_casts_kept`: the same, for the weights whose casts outlive a region."""
_kept_ids: frozenset[int] = frozenset()
_casts_between_scopes: weakref.WeakKeyDictionary[
    torch.nn.Module, dict[int, tuple[torch.Tensor, int, torch.Tensor]]
] = weakref.WeakKeyDictionary()
"""The kept casts of each model's last :func:`frozen_casts_kept` scope, for its next one."""


@contextmanager
def frozen_casts_kept(model: torch.nn.Module) -> Iterator[None]:
    """Inside this, ``model``'s own frozen float32 weights (LoRA's base layers) are cast to the
    compute dtype once and the cast serves every :func:`compute_autocast` region, where outside
    each region casts them again.

    A LoRA update runs the same base weights in several regions: the reference forward (the
    adapter switched off), the old log-probs, and a forward per micro-batch; each cast reads and
    writes the whole base model (measured: 10% of a LoRA update of the embedded model on a CPU
    with AMX, where the bfloat16 products are fast). The policy's backward keeps one cast alive
    in any case, so keeping it for the update adds no peak memory. Not so with gradient
    checkpointing, whose backward recomputes each layer with casts of its own and keeps nothing
    from the forward: kept casts would add a bfloat16 copy of the base model to its peak, so
    nothing is kept then. Frozen weights of other models (a separate reference copy) are not
    kept either: their casts would stay alive through the policy's backward. Nothing changes for
    a model without a compute dtype.

    The casts also outlive the scope: the next scope for the same model starts with them (a
    cast still serves while its weight is the same tensor at the same version). LoRA's base
    never changes, so it is cast once per run instead of once per update (measured: 110 ms of a
    2.3 s LoRA step of the embedded model). The copy then stays alive through the rollout too,
    which does not raise the peak where the update is the larger phase (it holds the copy and
    the activations at once); outside any scope, casts are made per region as before.
    """
    global _kept_casts, _kept_ids
    if compute_dtype(model) is None or is_checkpointing(model):
        yield
        return
    outer = _kept_casts, _kept_ids
    _kept_ids = frozenset(
        id(p) for p in model.parameters() if not p.requires_grad and p.dtype == torch.float32
    )
    # Keyed weakly by the model, not stored on it: a deep copy of the model (a merged save)
    # must not copy the casts.
    previous = _casts_between_scopes.get(model, {})
    _kept_casts = {key: hit for key, hit in previous.items() if key in _kept_ids}
    _casts_between_scopes[model] = _kept_casts
    try:
        yield
    finally:
        _kept_casts, _kept_ids = outer


@contextmanager
def compute_autocast(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model``'s forwards inside this to compute in its marked dtype (CPU autocast: linear
    layers and attention in bfloat16, norms, softmax and the residual stream in float32); without
    a mark, nothing changes. Gradients reach the float32 weights through autocast's casts."""
    global _frozen_casts
    dtype = compute_dtype(model)
    if dtype is None:
        yield
        return
    outer, _frozen_casts = _frozen_casts, {}
    try:
        with torch.autocast("cpu", dtype=dtype):
            yield
    finally:
        _frozen_casts = outer


def store_frozen_linears_in_compute_dtype(
    model: torch.nn.Module, *, shared: bool = True
) -> list[str]:
    """Store a frozen model's float32 linear weights in its compute dtype (see
    :func:`set_compute_dtype`), which its forwards would cast them to anyway: the same products
    to the bit, half the memory, and no cast per forward. For a full fine-tuning run's
    reference copy, which nothing trains and nothing saves, and for LoRA's frozen base layers,
    which a merged save reads again from the model's files (grpokit.models.loading.Policy.save).

    Only linear weights change (biases, norms and embeddings keep float32, as autocast computes
    them). A head tied to the embedding gets its own copy, so the embedding output, the residual
    stream's start, stays float32; with ``shared`` False a weight shared with another module is
    left as it is instead (a tied head keeps its tie, and its cast per region). Nothing changes
    for a model without a compute dtype, or for weights that require grad.

    Returns:
        The names (``model.named_modules()``) of the layers whose weight was converted.
    """
    dtype = compute_dtype(model)
    if dtype is None:
        return []
    uses: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        uses[id(param)] = uses.get(id(param), 0) + 1
    converted = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if (
            isinstance(module, torch.nn.Linear)
            and isinstance(weight, torch.nn.Parameter)
            and not weight.requires_grad
            and weight.dtype == torch.float32
            and not getattr(module, "keeps_float32", False)  # cast_lm_head_to_fp32's head
            and (shared or uses.get(id(weight), 1) == 1)
        ):
            module.weight = torch.nn.Parameter(weight.detach().to(dtype), requires_grad=False)
            converted.append(name)
    return converted


def _frozen_cast(weight: torch.Tensor) -> torch.Tensor:
    """A frozen float32 weight cast to the autocast dtype once per :func:`compute_autocast` region.

    Autocast caches the casts of trainable weights for its region, not of frozen ones (LoRA's
    base layers, a reference copy): each forward would cast them again, and the backward keeps
    each cast alive. A GRPO forward that encodes the prompts first runs the model twice; under
    LoRA that held two bfloat16 copies of the base weights (measured: 460 MB more peak memory
    than float32 on the embedded model) where one serves both.
    """
    if _frozen_casts is None or weight.requires_grad or weight.dtype != torch.float32:
        return weight
    casts = _kept_casts if id(weight) in _kept_ids else _frozen_casts
    hit = casts.get(id(weight))
    # The version check: a weight changed in place (an adapter merged into it) is cast again.
    if hit is None or hit[0] is not weight or hit[1] != weight._version:
        hit = (weight, weight._version, weight.to(torch.get_autocast_dtype("cpu")))
        casts[id(weight)] = hit
    return hit[2]


def _applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    # Under CPU autocast torch's own linear casts to bfloat16 (caching the weight's cast for the
    # region) and runs oneDNN's bf16 product: leave it to autocast.
    return (
        not torch.is_autocast_enabled("cpu")
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.numel() > 0
    )


def _mm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (N, in) @ weight (out, in)^T + bias, by oneDNN: (N, out)."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return out


class _OneDNNLinearFunction(torch.autograd.Function):
    """y = x W^T + b with the forward and both backward products in oneDNN."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(flat, weight)
        ctx.has_bias = bias is not None
        out = _mm(flat, weight, bias)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        flat, weight = ctx.saved_tensors
        grad = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            # dL/dx = g W: a linear layer whose weight is W^T.
            grad_x = _mm(grad, weight.t(), None).view(*grad_out.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            # dL/dW = g^T x: rows are output features, "weight" is x^T (contiguous copies are
            # faster for oneDNN than the strided views).
            grad_w = _mm(grad.t().contiguous(), flat.t().contiguous(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(dim=0)
        return grad_x, grad_w, grad_b


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``torch.nn.functional.linear`` computed by oneDNN where it applies (float32 on CPU).

    Args:
        x: (..., in); weight: (out, in); bias: (out,) or None.

    Returns:
        (..., out).
    """
    if torch.is_autocast_enabled("cpu"):
        return torch.nn.functional.linear(x, _frozen_cast(weight), bias)
    if not _applies(x, weight):
        return torch.nn.functional.linear(x, weight, bias)
    out: torch.Tensor = _OneDNNLinearFunction.apply(x, weight, bias)  # type: ignore[no-untyped-call]
    return out


class OneDNNLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose float32 CPU forward and backward run in oneDNN."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return onednn_linear(input, self.weight, self.bias)


def use_onednn_linears(model: torch.nn.Module, mode: CpuMatmul = "auto") -> int:
    """Make ``model``'s plain ``nn.Linear`` layers compute through oneDNN (in place).

    Only modules of exactly ``nn.Linear`` change class (LoRA's inner layers included; wrappers
    and subclasses such as quantised layers are left alone). Parameters, state dict and
    ``isinstance(m, nn.Linear)`` are unchanged.

    Args:
        mode: "auto" (when this build has oneDNN and :func:`onednn_training_pays`), "onednn"
            (raise if the build has no oneDNN), "torch" (change nothing).

    Returns:
        How many layers now use oneDNN.
    """
    if mode == "torch" or (mode == "auto" and not onednn_training_pays()):
        return 0
    if not onednn_available():
        if mode == "onednn":
            raise UserError(
                "model.cpu_matmul: onednn needs a PyTorch build with oneDNN (mkldnn); "
                "set it to auto or torch"
            )
        return 0
    changed = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = OneDNNLinear
            changed += 1
    return changed


class PackedLinear:
    """One linear layer's weight prepacked for oneDNN, for inference (no autograd).

    The packed copy is a snapshot: build it again after the weight changes.

    Args:
        weight: (out, in) float32 (or bfloat16) on CPU; bias: (out,) or None.
        dtype: the packed copy's dtype (float32, or bfloat16 where :func:`cpu_bf16_native`);
            inputs must have it, and outputs have it.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.out_features = int(weight.shape[0])
        self.bias = None if bias is None else bias.detach().to(dtype)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) -> (..., out)."""
        out = _mm(x.reshape(-1, x.shape[-1]), self.packed, self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    @staticmethod
    def applies(module: torch.nn.Module) -> bool:
        """Whether ``module`` is a plain CPU linear layer that can be packed: float32 weights,
        or bfloat16 ones where the CPU multiplies bfloat16 natively (LoRA's frozen base stored
        in the compute dtype, grpokit.models.loading.Policy.narrow_frozen_base)."""
        weight = getattr(module, "weight", None)
        return (
            isinstance(module, torch.nn.Linear)
            and isinstance(weight, torch.Tensor)
            and weight.device.type == "cpu"
            and (
                weight.dtype == torch.float32
                or (weight.dtype == torch.bfloat16 and cpu_bf16_native())
            )
            and not hasattr(weight, "device_mesh")  # a sharded (DTensor) weight: not gathered
            and onednn_available()
        )
