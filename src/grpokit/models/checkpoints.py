"""Finding checkpoints and the model a command-line argument names: the one resolver, used by
sampling, training, eval, generate and export.

A run directory holds ``checkpoint-<step>/`` directories (see :mod:`grpokit.train.checkpoint`),
each with the loadable model in ``model/``. Checkpoints are written beside their final name and
renamed into place, so a ``checkpoint-<step>`` directory is complete; half-written ones are named
``.tmp-checkpoint-<step>`` and never match.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from grpokit.errors import UserError
from grpokit.hub.embedded import EMBEDDED_MODEL
from grpokit.models.loading import POLICY_FILE
from grpokit.models.manifest import MANIFEST, CheckpointDamaged, check_model

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_LABEL = re.compile(r"^(?P<label>[A-Za-z0-9_.\-]+)=(?P<path>.+)$")


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """The ``checkpoint-<step>`` directories of a run, oldest (lowest step) first."""
    found = []
    for path in run_dir.glob("checkpoint-*"):
        match = _CHECKPOINT.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The run's newest checkpoint, or None when it has none."""
    found = checkpoint_dirs(run_dir)
    return found[-1] if found else None


def best_checkpoint(run_dir: Path, *, option: str = "RUN_DIR") -> Path:
    """The checkpoint a run recorded as its best by training.metric_for_best_model: the
    ``best_model_checkpoint`` of its newest readable ``trainer_state.json`` (each checkpoint
    writes the best one known when it was written, and rotation never deletes it).

    Raises:
        UserError: not a run directory, no best checkpoint recorded, or the recorded one gone.
    """
    found = checkpoint_dirs(run_dir)
    if not found:
        raise UserError(f"{option} {run_dir}: not a run directory (no checkpoint-N inside)")
    for ckpt in reversed(found):
        try:
            state = json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # damaged: an earlier checkpoint's record is the newest readable one
        if isinstance(state, dict):
            break
    else:
        raise UserError(f"{option} {run_dir}: no checkpoint has a readable trainer_state.json")
    name = state.get("best_model_checkpoint")
    if name is None:
        raise UserError(
            f"{option} {run_dir}: the run recorded no best checkpoint (it needs "
            "training.metric_for_best_model or load_best_model_at_end, the periodic held-out "
            "eval, and a checkpoint written at an eval step); give a checkpoint-N directory"
        )
    if not isinstance(name, str) or not _CHECKPOINT.match(name):
        raise UserError(f"{ckpt / 'trainer_state.json'}: best_model_checkpoint {name!r} is damaged")
    if not (run_dir / name).is_dir():
        raise UserError(
            f"{option} {run_dir}: its best checkpoint {name} (recorded in {ckpt.name}) is gone"
        )
    return run_dir / name


def _loads_best(run_dir: Path) -> bool:
    """Whether the run's config asks for its best checkpoint as its model
    (training.load_best_model_at_end)."""
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # no readable config: the latest checkpoint, as for any run
    training = config.get("training") if isinstance(config, dict) else None
    return isinstance(training, dict) and training.get("load_best_model_at_end") is True


def _is_checkpoint(path: Path) -> bool:
    """A training checkpoint-N directory (its model in ``model/``), whole or damaged."""
    markers = ("model", MANIFEST, "trainable.safetensors", "trainer_state.json")
    return any((path / name).exists() for name in markers)


def _holds_model(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def _intact_model(run_dir: Path, damaged: CheckpointDamaged, option: str) -> UserError:
    """The error for a run whose latest checkpoint is damaged, naming the newest intact one."""
    for earlier in reversed(checkpoint_dirs(run_dir)[:-1]):
        try:
            check_model(earlier / "model")
        except CheckpointDamaged:
            continue
        return UserError(
            f"{option} {run_dir}: its latest checkpoint is damaged: {damaged}. The newest "
            f"intact one is {earlier}: give it instead"
        )
    return UserError(
        f"{option} {run_dir}: its latest checkpoint is damaged ({damaged}), and it has no "
        "intact earlier one"
    )


def model_dir(path: Path, *, option: str = "--checkpoint") -> Path:
    """The loadable model of a checkpoint: ``checkpoint-N/model`` for a training checkpoint, the
    directory itself for an SFT output or any saved model."""
    path = path.expanduser()
    if not path.is_dir():
        raise UserError(f"{option} {path}: no such directory")
    if (path / "model").is_dir() and _holds_model(path / "model"):
        return path / "model"
    if _holds_model(path):
        return path
    raise UserError(
        f"{option} {path}: holds no model (no config.json or adapter_config.json, and no "
        "model/ subdirectory); give a training checkpoint-N directory or an SFT output directory"
    )


@dataclass(frozen=True)
class ModelSpec:
    """What to load for one model argument: a base name or directory, and weights to apply."""

    label: str
    name_or_path: str
    init_from: str | None
    given: str
    run_dir: Path | None = None
    """The run directory the checkpoint comes from, if any (its config.yaml can be used)."""


def resolve_model(
    arg: str, *, option: str = "--model", embedded_default: str = EMBEDDED_MODEL, best: bool = False
) -> ModelSpec:
    """Turn a model argument into what to load.

    Accepted: ``[LABEL=]X`` where X is a named model (the embedded default, a named offline model),
    a GGUF file, a hub name, a model directory
    (config.json), a grpokit checkpoint (``checkpoint-N/`` or its ``model/``; a LoRA adapter is
    merged into the base model named in its grpokit_policy.json), or a run directory (its latest
    checkpoint; its best one, :func:`best_checkpoint`, with ``best`` or when its config sets
    training.load_best_model_at_end). ``option`` names the argument in error messages.
    """
    label: str | None = None
    match = _LABEL.match(arg)
    if match and not Path(arg).exists():
        label, arg = match.group("label"), match.group("path")
    path = Path(arg).expanduser()
    if not path.exists():
        if arg.startswith((".", "/", "~")) or arg.count("/") > 1:
            raise UserError(f"{option} {arg}: no such directory")
        return ModelSpec(label or arg.rsplit("/", 1)[-1], arg, None, arg)
    if not path.is_dir():
        if path.suffix.lower() == ".gguf":  # converted once into the cache when loaded
            return ModelSpec(label or path.stem, str(path), None, arg)
        raise UserError(
            f"{option} {arg}: expected a model, checkpoint or run directory or a .gguf file, "
            "got another file"
        )
    run_dir: Path | None = None
    latest = latest_checkpoint(path)
    if latest is not None and not (path / "config.json").is_file():
        run_dir, path = path, latest
        if best:
            path = best_checkpoint(run_dir, option=option)
        elif _loads_best(run_dir):
            # As transformers loads the best model only where one was recorded.
            with contextlib.suppress(UserError):
                path = best_checkpoint(run_dir, option=option)
    elif best:
        raise UserError(f"{option} {arg}: --best takes a run directory (it holds checkpoint-N/)")
    if _is_checkpoint(path):
        run_dir = run_dir or (path.parent if (path.parent / "config.yaml").is_file() else None)
        default_label = f"{path.parent.name}/{path.name}"
        path = path / "model"
    else:
        default_label = path.name
    if _holds_model(path) or _is_checkpoint(path.parent):
        try:
            check_model(path)
        except CheckpointDamaged as e:
            if run_dir is not None and latest is not None and path.parent == latest:
                raise _intact_model(run_dir, e, option) from None
            raise UserError(f"{option} {arg}: a damaged checkpoint: {e}") from None
    if (path / "adapter_config.json").is_file():
        info_path = path / POLICY_FILE
        base = embedded_default
        if info_path.is_file():
            info = json.loads(info_path.read_text(encoding="utf-8"))  # checked: valid JSON
            if isinstance(info, dict):
                base = str(info.get("base_model") or base)
        return ModelSpec(label or default_label, base, str(path), arg, run_dir)
    if (path / "config.json").is_file():
        return ModelSpec(label or default_label, str(path), None, arg, run_dir)
    raise UserError(
        f"{option} {arg}: {path} holds neither a model (config.json), a LoRA adapter "
        f"(adapter_config.json), nor checkpoint-N/ directories"
    )


def unique_labels(specs: list[ModelSpec]) -> list[ModelSpec]:
    """The specs with repeated labels numbered (``trained``, ``trained#2``, ...)."""
    seen: dict[str, int] = {}
    out = []
    for spec in specs:
        n = seen.get(spec.label, 0)
        seen[spec.label] = n + 1
        out.append(spec if n == 0 else replace(spec, label=f"{spec.label}#{n + 1}"))
    return out
