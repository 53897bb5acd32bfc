"""What grpokit needs to know about a transformers model that differs across versions and
wrappers: the model inside a peft wrapper, the forward's keyword names, activation checkpointing,
its train / eval mode."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    return base if isinstance(base, torch.nn.Module) else model


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward's keyword for a KV cache: transformers 5 renamed ``past_key_values`` to
    ``cache`` (the old name still works, with a deprecation warning)."""
    params = inspect.signature(hf_model(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model: torch.nn.Module) -> Any:
    """An empty transformers ``DynamicCache`` for ``model`` (built from its config when it has one,
    which newer transformers use to lay out per-layer caches)."""
    from transformers import DynamicCache

    config = getattr(hf_model(model), "config", None)
    return DynamicCache(config=config) if config is not None else DynamicCache()


def logits_to_keep_kwarg(model: torch.nn.Module) -> str | None:
    """The forward's keyword for "logits of the last k positions only", if it has one."""
    params = inspect.signature(hf_model(model).forward).parameters
    return next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether activation checkpointing is on and active (in training mode).

    transformers' ``is_activation_checkpointing`` walks every module for one that has it on
    (10 ms on the embedded model with LoRA, asked several times a step). Its switch sets the
    flag on the model body and on every layer whose index is a multiple of ``every_n_layers``,
    layer 0 included, so the first module carrying the flag says the same sooner.
    """
    inner = hf_model(model)
    if not inner.training:
        return False
    flag = next(
        (m.gradient_checkpointing for m in inner.modules() if hasattr(m, "gradient_checkpointing")),
        False,
    )
    return bool(flag)


def adapter_in_effect(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a peft adapter layer whose adapter changes its output: active and not
    merged into its base weights. Otherwise it computes exactly its base layer."""
    if not callable(getattr(module, "get_base_layer", None)):
        return False
    return not (getattr(module, "merged", False) or getattr(module, "disable_adapters", False))


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside (no dropout), in its own mode again after. Switching walks
    every module, so a hot path switches only where a module's forward runs."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
