"""What grpokit needs to know about a transformers model that differs across versions and
wrappers: the model inside a peft wrapper, the forward's keyword names, activation checkpointing."""

from __future__ import annotations

import inspect

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


def logits_to_keep_kwarg(model: torch.nn.Module) -> str | None:
    """The forward's keyword for "logits of the last k positions only", if it has one."""
    params = inspect.signature(hf_model(model).forward).parameters
    return next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether activation checkpointing is on and active (in training mode)."""
    inner = hf_model(model)
    flag = getattr(inner, "is_activation_checkpointing", None)
    if flag is None:  # transformers < 5
        flag = getattr(inner, "is_gradient_checkpointing", False)
    return bool(flag) and inner.training
