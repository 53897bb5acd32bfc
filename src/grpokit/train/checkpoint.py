"""Checkpoints: everything needed to continue a run exactly, written atomically.

checkpoint-<step>/
  model/            the adapter (LoRA) or full model + tokenizer, loadable on its own
  trainable.safetensors   the trainable parameters by name (what resume loads back)
  optimizer.pt, scheduler.pt, rng.pt
  trainer_state.json      step, data position, metrics needed to continue
  curriculum.json         with training.curriculum: each prompt's record (optional)
  config.yaml             the resolved config
  manifest.json           written last: every file's size and sha256, the tensors' names,
                          shapes and dtypes (see grpokit.models.manifest)

A checkpoint is checked whole before anything of it is loaded: its manifest (or, for a
checkpoint written before manifests, each file's format), the trainer state's fields, and every
tensor's name, shape and dtype against the model it is loaded into.
"""

from __future__ import annotations

import errno
import json
import math
import random
import re
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from grpokit.models.manifest import (
    CheckpointDamaged,
    TensorInfo,
    check_file_format,
    check_model,
    safetensors_header,
    verify_checkpoint,
    write_manifest,
)
from grpokit.sampling import checkpoint_dirs
from grpokit.train.fsdp import load_full_state

STATE_VERSION = 3
"""The layout of trainer_state.json (its fields, below); the manifest records it. Version 2 added
the best-checkpoint fields, which a version 1 file lacks (read as none recorded); version 3 the
adaptive entropy controller's (read as not moved yet)."""

RESUME_FILES = (
    "trainable.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "rng.pt",
    "trainer_state.json",
)
"""The files a resume reads (besides model/, which eval and export read)."""

CURRICULUM_FILE = "curriculum.json"
"""training.curriculum's records (prompt index -> [groups, last mean reward, last flat]); a
checkpoint written without the curriculum has none."""


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
    best_metric: float | None = None
    """The best value of training.metric_for_best_model over the periodic evals so far."""
    best_global_step: int | None = None
    """The step of that eval."""
    best_model_checkpoint: str | None = None
    """The best checkpoint's directory name (``checkpoint-N``, in the run directory): of the
    checkpoints written at an eval step, the one with the best value."""
    best_model_checkpoint_metric: float | None = None
    """That checkpoint's value."""
    early_stopping_patience_counter: int = 0
    """Evals in a row that did not improve on best_metric (transformers' name)."""
    entropy_coef: float | None = None
    """training.use_adaptive_entropy: the coefficient the controller has reached (None: not
    moved yet, training.entropy_coef)."""
    last_entropy: float | None = None
    """training.use_adaptive_entropy: the last step's entropy over its trained tokens (None: no
    step measured yet; no bonus is applied before one)."""


_V1_FIELDS = (
    "global_step", "epoch", "position", "generation_round", "skipped_steps", "nonfinite_streak",
)  # fmt: skip
"""The fields every trainer_state.json has; the others were added later and may be missing."""


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
    curriculum: dict[str, Any] | None = None,
) -> Path:
    """Write ``checkpoint-<global_step>`` into ``run_dir``.

    ``model_state`` and ``optimizer_state`` replace the model's and optimizer's own state dicts
    when given: the whole tensors gathered from a sharded (FSDP) model, in the same layout.
    ``rng`` replaces the current random states (see :func:`rng_state`): those taken at the start
    of a step that then failed. ``curriculum``: the curriculum's records (curriculum.json).
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
            curriculum=curriculum,
        )
    except BaseException as exc:
        full = _out_of_space(run_dir, exc)
        shutil.rmtree(tmp, ignore_errors=True)
        if full and not isinstance(exc, OSError):
            # torch.save reports a full disk as a RuntimeError about stream positions.
            raise OSError(errno.ENOSPC, f"no space left on the disk writing {final}") from exc
        raise
    # Replacing a checkpoint of the same step: move the old one aside first, so that a
    # checkpoint-<step> directory is always whole (the resolver trusts the name).
    stale = run_dir / f".old-checkpoint-{state.global_step}"
    if final.exists():
        shutil.rmtree(stale, ignore_errors=True)
        final.rename(stale)
    tmp.rename(final)
    shutil.rmtree(stale, ignore_errors=True)
    rotate_checkpoints(run_dir, save_total_limit, keep=state.best_model_checkpoint)
    return final


def rotate_checkpoints(run_dir: Path, save_total_limit: int | None, *, keep: str | None) -> None:
    """Delete the oldest checkpoints beyond ``save_total_limit``, never the latest (a resume
    needs it) nor ``keep`` (the best checkpoint's name), as transformers' rotation does: with a
    best one that is not the latest, a limit of 1 keeps two."""
    if not save_total_limit:
        return
    found = checkpoint_dirs(run_dir)
    protected = {found[-1].name} if found else set()
    if keep is not None and (run_dir / keep) in found:
        protected.add(keep)
    excess = len(found) - max(save_total_limit, len(protected))
    for old in [p for p in found if p.name not in protected][: max(0, excess)]:
        shutil.rmtree(old, ignore_errors=True)


def _out_of_space(directory: Path, exc: BaseException) -> bool:
    """Whether a write into ``directory`` failed for want of space: the error says so, or the
    disk has (almost) nothing left as it failed."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return shutil.disk_usage(directory).free < 1 << 20
    except OSError:
        return False


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
    curriculum: dict[str, Any] | None = None,
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
    if curriculum is not None:
        (tmp / CURRICULUM_FILE).write_text(json.dumps(curriculum), encoding="utf-8")
    write_manifest(tmp, trainer_state_version=STATE_VERSION)  # last: the checkpoint is whole


def read_curriculum(checkpoint: Path) -> Any | None:
    """The parsed curriculum.json of ``checkpoint`` (None when it has none).

    Raises:
        CheckpointDamaged: when it is not JSON.
    """
    path = checkpoint / CURRICULUM_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointDamaged(path, f"not valid JSON ({exc})") from None


def read_trainer_state(path: Path) -> TrainerState:
    """trainer_state.json: every field of version 1 present, a whole number of at least 0; the
    best-checkpoint fields (version 2) null or of their type; no other key.

    Raises:
        CheckpointDamaged: naming the file and the field.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointDamaged(path, "missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointDamaged(path, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointDamaged(path, f"expected a JSON object, got {type(data).__name__}")
    names = [f.name for f in fields(TrainerState)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise CheckpointDamaged(path, f"unknown field {unknown[0]!r} (expected {', '.join(names)})")
    missing = [n for n in _V1_FIELDS if n not in data]
    if missing:
        raise CheckpointDamaged(
            path, f"field {missing[0]!r} is missing: a resume would restart it from 0"
        )
    for name, value in data.items():
        if name in ("best_metric", "best_model_checkpoint_metric", "entropy_coef", "last_entropy"):
            ok = value is None or (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
            )
            expected = "a finite number or null"
        elif name == "best_model_checkpoint":
            ok = value is None or (
                isinstance(value, str) and _CHECKPOINT_NAME.match(value) is not None
            )
            expected = "a checkpoint-<step> directory name or null"
        else:
            nullable = name == "best_global_step"
            ok = (nullable and value is None) or (
                isinstance(value, int) and not isinstance(value, bool) and value >= 0
            )
            expected = "a whole number of at least 0" + (" or null" if nullable else "")
        if not ok:
            raise CheckpointDamaged(path, f"field {name!r} is {value!r}; expected {expected}")
    return TrainerState(**data)


_CHECKPOINT_NAME = re.compile(r"^checkpoint-\d+$")


_DTYPES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip


def _check_weights(
    file: Path, tensors: dict[str, TensorInfo], params: dict[str, torch.nn.Parameter]
) -> None:
    """The saved trainable tensors are exactly the model's trainable parameters, each of the
    parameter's shape and dtype (a copy_ would broadcast a wrong shape, cast a wrong dtype)."""
    trainable = {n: p for n, p in params.items() if p.requires_grad}
    unknown = [n for n in tensors if n not in params]
    if unknown:
        raise CheckpointDamaged(
            file,
            f"holds {unknown[0]!r}, which the configured model does not have; resume with "
            "the run's own config",
        )
    missing = [n for n in trainable if n not in tensors]
    if missing:
        raise CheckpointDamaged(file, f"lacks the trainable parameter {missing[0]!r}")
    for name, info in tensors.items():
        param = params[name]
        want = (_DTYPES.get(param.dtype, str(param.dtype)), tuple(param.shape))
        if (info.dtype, info.shape) != want:
            raise CheckpointDamaged(
                file,
                f"tensor {name!r} is {info.dtype} {list(info.shape)}; the model's "
                f"parameter is {want[0]} {list(want[1])}",
            )


def check_checkpoint(path: Path, params: dict[str, torch.nn.Parameter]) -> TrainerState:
    """Everything about a checkpoint that can be checked without loading it: its manifest (or
    each file's format), the files a resume needs, the trainer state and the saved tensors'
    names, shapes and dtypes against ``params``. Returns the trainer state.

    Raises:
        CheckpointDamaged: naming the first damaged or missing file and what is wrong.
    """
    manifest = verify_checkpoint(path)
    for name in RESUME_FILES:
        if not (path / name).is_file():
            raise CheckpointDamaged(path / name, "missing: the checkpoint cannot resume a run")
    if manifest is not None and (manifest.trainer_state_version or 0) > STATE_VERSION:
        raise CheckpointDamaged(
            path / "trainer_state.json",
            f"layout version {manifest.trainer_state_version}, written by a newer grpokit; "
            "upgrade grpokit to resume it",
        )
    state = read_trainer_state(path / "trainer_state.json")
    if manifest is None:  # written before manifests: check what each file's format allows
        for name in RESUME_FILES:
            check_file_format(path / name)
        check_model(path / "model")
    file = path / "trainable.safetensors"
    _check_weights(file, safetensors_header(file), params)
    return state


_NUMPY_STATE: list[Any] = [
    np.zeros(1).__reduce__()[0],  # the function arrays unpickle through (numpy's _reconstruct)
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
]
"""What NumPy's random state (in rng.pt) unpickles to, allowed on top of torch's own types."""


def _torch_load(path: Path) -> Any:
    """A .pt file with ``weights_only`` (tensors, numbers, strings and containers; NumPy's
    random state): a damaged or hostile file raises CheckpointDamaged, it never runs code."""
    try:
        with torch.serialization.safe_globals(_NUMPY_STATE):
            return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointDamaged(path, f"unreadable ({type(exc).__name__}: {first[:160]})") from None


def _check_optimizer_state(
    path: Path, state: Any, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]
) -> None:
    """The optimizer state's groups hold the parameters the optimizer has, and each
    per-parameter tensor (Adam's moments) has its parameter's shape."""
    if not (
        isinstance(state, dict)
        and isinstance(state.get("state"), dict)
        and isinstance(state.get("param_groups"), list)
    ):
        raise CheckpointDamaged(path, "not an optimizer state (no 'state' and 'param_groups')")
    groups = state["param_groups"]
    sizes = [len(g.get("params", [])) if isinstance(g, dict) else -1 for g in groups]
    want = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != want:
        raise CheckpointDamaged(
            path, f"holds parameter groups of sizes {sizes}; the optimizer's are {want}"
        )
    for index, values in state["state"].items():
        if (
            not isinstance(index, int)
            or not 0 <= index < len(params)
            or not isinstance(values, dict)
        ):
            raise CheckpointDamaged(path, f"holds state for an unknown parameter {index!r}")
        for key, value in values.items():
            shape = params[index].shape
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shape:
                raise CheckpointDamaged(
                    path, f"{key} of parameter {index} is {list(value.shape)}; it is {list(shape)}"
                )


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

    The checkpoint is checked first (see :func:`check_checkpoint`) and every file read before
    anything is restored, so a damaged one raises :class:`CheckpointDamaged` and changes
    nothing. With ``sharded`` (an FSDP model, every rank calling), rank 0 reads the weights and
    the optimizer state and the other ranks receive their shards.
    """
    params = dict(policy.model.named_parameters())
    state = check_checkpoint(path, params)
    ordered = [p for group in optimizer.param_groups for p in group["params"]]

    def read() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        try:
            weights = load_file(str(path / "trainable.safetensors"))
        except Exception as exc:
            raise CheckpointDamaged(path / "trainable.safetensors", f"unreadable ({exc})") from None
        optimizer_state = _torch_load(path / "optimizer.pt")
        _check_optimizer_state(path / "optimizer.pt", optimizer_state, optimizer, ordered)
        return weights, optimizer_state

    scheduler_state = _torch_load(path / "scheduler.pt")
    if not isinstance(scheduler_state, dict):
        raise CheckpointDamaged(path / "scheduler.pt", "not a learning-rate schedule's state")
    rng = _torch_load(path / "rng.pt")
    keys = ("python", "numpy", "torch", "cuda", "generator")
    if not isinstance(rng, dict) or any(k not in rng for k in keys):
        raise CheckpointDamaged(path / "rng.pt", f"not the random states ({', '.join(keys)})")
    if sharded:
        load_full_state(policy.model, optimizer, read)
    else:
        weights, optimizer_state = read()
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(value.to(params[name].device))
        _restore(path / "optimizer.pt", lambda: optimizer.load_state_dict(optimizer_state))
    _restore(path / "scheduler.pt", lambda: scheduler.load_state_dict(scheduler_state))
    _restore(path / "rng.pt", lambda: _set_rng(rng, generator))
    return state


def _restore(path: Path, apply: Any) -> None:
    try:
        apply()
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as exc:
        raise CheckpointDamaged(
            path, f"does not fit this run ({type(exc).__name__}: {exc})"
        ) from None


def _set_rng(rng: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(tuple(rng["python"]) if isinstance(rng["python"], list) else rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    generator.set_state(rng["generator"])
