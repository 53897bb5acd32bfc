"""Fully sharded data parallel (FSDP2) GRPO, for models whose weights, gradients and optimizer
state do not fit one device.

With ``training.fsdp`` and 2+ processes, every rank keeps 1/N of each parameter (torch's
``fully_shard``: per-parameter DTensors sharded on dim 0). A single process shards only where it
has joined a process group of one itself: nothing is saved then, but the code below runs on one
device (bench/gpu_check.py does this on a GPU). The split of the data, the reward
gathering and the loss normalisation are those of :mod:`grpokit.train.distributed`; what sharding
changes, and why:

- each decoder layer is one FSDP unit and the root (embeddings, final norm, head) another, so a
  layer's whole weights exist only while it runs (``reshard_after_forward``, transformers'
  full_shard) or from its forward to its backward (shard_grad_op);
- gradients are reduce-scattered with a SUM, not FSDP's default mean: the losses are already
  normalised by global counts, so the sum is the global gradient, the one the data-parallel
  all-reduce gives (:func:`~grpokit.train.distributed.all_reduce_gradients` is not called);
- every micro-batch reduce-scatters, and the sharded gradients add up over micro-batches.
  Deferring the sync to the last micro-batch (``set_requires_gradient_sync(False)``) would hold
  an unsharded gradient of the whole model on every rank: the memory FSDP is there to save;
- every forward and backward is a collective, so all ranks run the same number of micro-batches:
  a rank with fewer rows (dynamic sampling keeps different numbers of groups) runs
  :func:`idle_pass` for the rest;
- generation is not: :func:`gathered` gathers every unit once for the whole rollout and keeps it
  whole, so each rank decodes its own completions, of their own lengths, without collectives;
- ``clip_grad_norm_`` on DTensor gradients sums the squared norms over ranks: the global norm;
- checkpoints are the files a single process writes, with whole tensors (gathered on every rank,
  written by rank 0) and the optimizer state keyed by parameter index as in
  ``optimizer.state_dict()``, so a run saved with or without FSDP resumes with or without it.
  Resuming under FSDP, rank 0 reads the files and the other ranks receive their shards.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from grpokit.errors import UserError
from grpokit.models.compat import hf_model
from grpokit.rollout.base import EngineCapabilities, RolloutBatch, RolloutEngine, SamplingParams
from grpokit.train.distributed import DistContext, all_reduce_gradients, all_reduce_scalars

# torch.distributed's FSDP, DTensor and checkpoint modules add about 0.7 s to the start: they are
# imported where used, so a run without FSDP does not pay for them.
if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

    from grpokit.models.loading import Policy

__all__ = [
    "GatheredEngine",
    "LockStep",
    "full_state",
    "gathered",
    "idle_pass",
    "load_full_state",
    "missing_micro_batches",
    "shard_policy",
]

_RESHARD_AFTER_FORWARD: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()
"""Each FSDP unit's own reshard_after_forward, for :func:`gathered` to restore."""


def _layers(
    model: torch.nn.Module, layer_classes: Sequence[str] | None
) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """The transformers model in ``model`` and its layers to shard one by one."""
    hf = hf_model(model)
    names = list(layer_classes or getattr(hf, "_no_split_modules", None) or [])
    layers = [m for m in hf.modules() if type(m).__name__ in names]
    if not layers:
        raise UserError(
            f"training.fsdp: no layer of class {names or '(none named)'} in "
            f"{type(hf).__name__}; set training.fsdp_config.transformer_layer_cls_to_wrap to "
            "the class name of its decoder layers"
        )
    return hf, layers


def shard_policy(
    policy: Policy,
    device: torch.device,
    world_size: int,
    *,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    layer_classes: Sequence[str] | None = None,
) -> None:
    """Shard the policy's model (and its reference copy, if any) over ``world_size`` ranks, in place.

    Every rank must call this with the same, whole weights (they are cut, not compared). The
    weights may be on the CPU: each unit is moved to ``device`` as it is sharded, so the whole
    model never has to fit there. The optimizer must be built afterwards (the parameters become
    DTensors).

    Args:
        policy: a :class:`~grpokit.models.loading.Policy`; under LoRA the adapter's weights are
            sharded with the layers they belong to, and the reference is the same network.
        device: where the shards live (and where gathered weights are computed).
        world_size: the number of ranks (all of the default process group).
        reshard_after_forward: free a layer's gathered weights after its forward (True) or keep
            them until its backward (False).
        cpu_offload: keep the shards, gradients and optimizer state in CPU memory.
        layer_classes: class names of the layers to shard one by one; default the model's
            ``_no_split_modules``.

    Raises:
        UserError: when no layer of those classes is found.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

    # The policy's root (embeddings, head) is what backward needs first: keep it after forward.
    # The reference runs forward only: nothing needs its gathered weights after that.
    plan = [(*_layers(policy.model, layer_classes), reshard_after_forward, False)]
    if policy.reference is not None:
        plan.append((*_layers(policy.reference, layer_classes), True, True))
    mesh = init_device_mesh(device.type, (world_size,))
    # Pinned memory needs an accelerator; on a CPU run the offload policy changes nothing anyway.
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if cpu_offload else OffloadPolicy()
    for hf, layers, reshard, root_reshard in plan:
        for layer in layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, offload_policy=offload)
            _RESHARD_AFTER_FORWARD[layer] = reshard
        fully_shard(hf, mesh=mesh, reshard_after_forward=root_reshard, offload_policy=offload)
        _RESHARD_AFTER_FORWARD[hf] = root_reshard
        for unit in hf.modules():
            if isinstance(unit, FSDPModule):
                # A plain SUM (see the module docstring); forcing SUM also keeps FSDP off the
                # PREMUL_SUM reduce op it would pick for a factor of 1, which gloo lacks.
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)


def _units(model: torch.nn.Module) -> list[FSDPModule]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Whole weights in every FSDP unit of ``model`` for the duration, then sharded again.

    Inside, each module's ``weight`` (Linear, Embedding, norms) is a plain tensor of full size,
    and forwards run no collectives, so ranks may run different numbers of them (a rollout).
    Entering is a collective (one all-gather per unit): every rank must enter together. A model
    without FSDP units is left alone.
    """
    units = _units(model)
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(_RESHARD_AFTER_FORWARD.get(unit, True), recurse=False)


class GatheredEngine(RolloutEngine):
    """A rollout engine whose ``generate`` runs inside :func:`gathered`: the engine calls the
    model a token at a time and reads module weights directly, which needs them whole. It
    offers the reference log-probs of the engine it wraps; generating ahead it does not forward
    (that would run outside the gathered weights, and no engine that generates ahead is wrapped:
    vLLM holds its own weights)."""

    def __init__(self, engine: RolloutEngine, model: torch.nn.Module) -> None:
        self.engine = engine
        self.model = model
        self.capabilities = EngineCapabilities(
            reference_logprobs=engine.capabilities.reference_logprobs
        )

    @property
    def reference_logprobs(self) -> bool:
        return self.engine.reference_logprobs

    @reference_logprobs.setter
    def reference_logprobs(self, value: bool) -> None:
        self.engine.reference_logprobs = value

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    def close(self) -> None:
        self.engine.close()

    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        with gathered(self.model):
            batch: RolloutBatch = self.engine.generate(prompt_ids, n, params, generator=generator)
        return batch


def missing_micro_batches(count: int, ctx: DistContext) -> int:
    """How many idle micro-batches this rank runs so that every rank runs as many as the most."""
    return int(all_reduce_scalars([float(count)], ctx, "max")[0]) - count


def idle_pass(
    model: torch.nn.Module, pad_token_id: int, device: torch.device, *, backward: bool
) -> None:
    """A forward of one token (and a backward of zero), for a rank out of micro-batches: its
    all-gathers and gradient reduce-scatters pair with those of the ranks still working, and it
    adds zero to every gradient."""
    ids = torch.full((1, 1), pad_token_id, dtype=torch.long, device=device)
    logits = model(input_ids=ids, use_cache=False).logits
    if backward:
        (logits.sum() * 0.0).backward()


class LockStep:
    """What sharding changes in an update, in one place, so the update itself has no FSDP branch.

    Under FSDP (``sharded``) every forward and backward is a collective: :meth:`plan` counts the
    micro-batches this rank lacks against the busiest rank, and :meth:`finish` runs that many
    :func:`idle_pass` es after a loop over its own; FSDP reduce-scatters gradients in backward, so
    :meth:`clip_gradients` only clips. Without FSDP, :meth:`finish` runs nothing and
    :meth:`clip_gradients` all-reduces first (a no-op for one process).
    """

    def __init__(
        self, dist: DistContext, *, sharded: bool, pad_token_id: int, device: torch.device
    ) -> None:
        self.dist, self.sharded = dist, sharded
        self.pad_token_id, self.device = pad_token_id, device
        self.idle = 0

    def plan(self, micro_batches: int) -> None:
        """Set how many idle passes each loop over this rank's ``micro_batches`` must add."""
        self.idle = missing_micro_batches(micro_batches, self.dist) if self.sharded else 0

    def finish(self, model: torch.nn.Module, *, backward: bool) -> None:
        """The idle passes that pair this rank's collectives with the busier ranks' ones."""
        for _ in range(self.idle):
            idle_pass(model, self.pad_token_id, self.device, backward=backward)

    def clip_gradients(self, parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """Sum the gradients over ranks (unless FSDP already reduce-scattered them), clip them to
        ``max_norm``; returns the global norm as a plain 0-d tensor."""
        if not self.sharded:
            all_reduce_gradients(parameters, self.dist)
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        # Under FSDP the norm is a DTensor, replicated on every rank: its local value is global.
        full_tensor = getattr(norm, "full_tensor", None)
        return full_tensor() if full_tensor is not None else norm


# ---- checkpoints -------------------------------------------------------------------------------


def _parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each optimizer parameter, in optimizer.state_dict()'s index order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The whole model state dict and optimizer state dict, on rank 0's CPU (empty elsewhere).

    A collective: every rank must call it. The optimizer state is keyed by parameter index, like
    ``optimizer.state_dict()`` of an unsharded model.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights: dict[str, Any] = get_model_state_dict(model, options=options)
    # Gathering copies each name apart; tied weights (embeddings and head) must stay one tensor,
    # as transformers' save_pretrained then writes it once, as it does for an unsharded model.
    first_name: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first = first_name.setdefault(id(p), name)
        if first != name and first in weights and name in weights:
            weights[name] = weights[first]
    by_name: dict[str, Any] = get_optimizer_state_dict(model, optimizer, options=options)
    if not by_name:
        return weights, {}
    index = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    return weights, {
        "state": {index[name]: value for name, value in by_name["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in by_name["param_groups"]
        ],
    }


def load_full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    read: Callable[[], tuple[dict[str, torch.Tensor], dict[str, Any]]],
) -> None:
    """Load whole weights (all or some parameters, by name) and an index-keyed optimizer state
    into a sharded model and its optimizer.

    A collective: every rank calls it, rank 0 alone calls ``read`` and the others receive their
    shards. A :class:`UserError` raised by ``read`` is raised on every rank.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights: dict[str, Any] = {}
    by_index: dict[str, Any] = {}
    failure: list[str | None] = [None]
    if dist.get_rank() == 0:
        try:
            weights, by_index = read()
        except UserError as e:
            failure = [str(e)]
    dist.broadcast_object_list(failure, src=0)
    if failure[0] is not None:
        raise UserError(failure[0])
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights, options=options)
    by_name: dict[str, Any] = {}
    if by_index:
        names = _parameter_names(model, optimizer)
        by_name = {
            "state": {names[i]: value for i, value in by_index["state"].items()},
            "param_groups": [
                {**group, "params": [names[i] for i in group["params"]]}
                for group in by_index["param_groups"]
            ],
        }
    set_optimizer_state_dict(model, optimizer, by_name, options=options)
    # The broadcast flattens hyperparameters, turning tuples (AdamW's betas) into lists; put them
    # back, so the next checkpoint holds what an unsharded run's would.
    for group in optimizer.param_groups:
        for key, value in group.items():
            if isinstance(value, list) and key != "params":
                group[key] = tuple(value)
