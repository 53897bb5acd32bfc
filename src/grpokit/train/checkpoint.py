"""Checkpoints: everything needed to continue a run exactly, written atomically.

checkpoint-<step>/
  model/            the adapter (LoRA) or full model + tokenizer, loadable on its own
  trainable.safetensors   the trainable parameters by name (what resume loads back)
  optimizer.pt, scheduler.pt, rng.pt
  trainer_state.json      step, data position, metrics needed to continue
  config.yaml             the resolved config
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from grpokit.errors import UserError
from grpokit.sampling import checkpoint_dirs
from grpokit.train.fsdp import load_full_state


@dataclass
class TrainerState:
    """Where the run stands. `epoch` and `position` index the shuffled prompt order."""

    global_step: int = 0
    epoch: int = 0
    position: int = 0
    generation_round: int = 0
    skipped_steps: int = 0
    """Optimizer steps skipped for a non-finite loss or gradient norm, in all."""
    nonfinite_streak: int = 0
    """Of them, how many in a row up to now."""


def remove_partial_checkpoints(run_dir: Path) -> list[Path]:
    """Delete what an interrupted checkpoint write left behind (``.tmp-checkpoint-N``,
    ``.old-checkpoint-N``); returns what was removed. Never touches a ``checkpoint-N``."""
    leftovers = [*run_dir.glob(".tmp-checkpoint-*"), *run_dir.glob(".old-checkpoint-*")]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every random state a run draws from: Python's, NumPy's, torch's (CPU and CUDA) and the
    rollout generator's. Saved with a checkpoint so that a resumed run draws what the
    uninterrupted one would."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generator": generator.get_state(),
    }


def save_checkpoint(
    run_dir: Path,
    *,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    generator: torch.Generator,
    state: TrainerState,
    config_yaml: str,
    save_total_limit: int | None,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    rng: dict[str, Any] | None = None,
) -> Path:
    """Write ``checkpoint-<global_step>`` into ``run_dir``.

    ``model_state`` and ``optimizer_state`` replace the model's and optimizer's own state dicts
    when given: the whole tensors gathered from a sharded (FSDP) model, in the same layout.
    ``rng`` replaces the current random states (see :func:`rng_state`): those taken at the start
    of a step that then failed.
    Written under ``.tmp-checkpoint-<step>`` and renamed when whole; a failed write (a full
    disk) removes its partial directory and leaves the earlier checkpoints as they were.
    """
    final = run_dir / f"checkpoint-{state.global_step}"
    tmp = run_dir / f".tmp-checkpoint-{state.global_step}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(
            tmp,
            policy=policy,
            model_state=model_state,
            optimizer_state=optimizer.state_dict() if optimizer_state is None else optimizer_state,
            scheduler_state=scheduler.state_dict(),
            rng=rng if rng is not None else rng_state(generator),
            state=state,
            config_yaml=config_yaml,
        )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Replacing a checkpoint of the same step: move the old one aside first, so that a
    # checkpoint-<step> directory is always whole (the resolver trusts the name).
    stale = run_dir / f".old-checkpoint-{state.global_step}"
    if final.exists():
        shutil.rmtree(stale, ignore_errors=True)
        final.rename(stale)
    tmp.rename(final)
    shutil.rmtree(stale, ignore_errors=True)
    if save_total_limit:
        for old in checkpoint_dirs(run_dir)[:-save_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _write(
    tmp: Path,
    *,
    policy: Any,
    model_state: dict[str, torch.Tensor] | None,
    optimizer_state: dict[str, Any],
    scheduler_state: dict[str, Any],
    rng: dict[str, Any],
    state: TrainerState,
    config_yaml: str,
) -> None:
    tmp.mkdir(parents=True)
    policy.save(tmp / "model", state_dict=model_state)
    trainable = {
        n: (p if model_state is None else model_state[n]).detach().cpu().contiguous()
        for n, p in policy.model.named_parameters()
        if p.requires_grad
    }
    save_file(trainable, str(tmp / "trainable.safetensors"))
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(scheduler_state, tmp / "scheduler.pt")
    torch.save(rng, tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(asdict(state), indent=2))
    (tmp / "config.yaml").write_text(config_yaml, encoding="utf-8")


def load_checkpoint(
    path: Path,
    *,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    generator: torch.Generator,
    sharded: bool = False,
) -> TrainerState:
    """Restore weights, optimizer, schedule and every RNG; returns the trainer state.

    With ``sharded`` (an FSDP model, every rank calling), rank 0 reads the weights and the
    optimizer state and the other ranks receive their shards.
    """
    missing = [
        name
        for name in ("trainable.safetensors", "optimizer.pt", "rng.pt", "trainer_state.json")
        if not (path / name).is_file()
    ]
    if missing:
        raise UserError(
            f"{path}: an incomplete checkpoint (no {', '.join(missing)}); it cannot resume a run. "
            "Move it aside to resume from the checkpoint before it."
        )
    params = dict(policy.model.named_parameters())

    def read() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        weights = load_file(str(path / "trainable.safetensors"))
        missing = [n for n in weights if n not in params]
        if missing:
            raise UserError(
                f"{path}: checkpoint parameters do not match the configured model "
                f"(e.g. {missing[0]}); resume with the run's own config"
            )
        return weights, torch.load(path / "optimizer.pt", weights_only=False)

    if sharded:
        load_full_state(policy.model, optimizer, read)
    else:
        weights, optimizer_state = read()
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value.to(params[name].device, params[name].dtype))
        optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng = torch.load(path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    generator.set_state(rng["generator"])
    return TrainerState(**json.loads((path / "trainer_state.json").read_text()))
