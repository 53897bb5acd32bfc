"""Seeding and device choice: the same rule for training, evaluation and preflight."""

from __future__ import annotations

import random

import numpy as np
import torch

from grpokit.errors import UserError


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (initialisation, dropout, shuffles).

    Sampling itself draws from explicit ``torch.Generator`` objects, so that what a rollout
    samples does not depend on how much other code consumed the global stream.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when available, else the CPU), or a torch device string such as
    ``cpu`` or ``cuda:1``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise UserError(
            f"model.device {name!r} is not a device: use 'auto', 'cpu', 'cuda' or 'cuda:N' ({exc})"
        ) from None
