"""Starting and resuming runs: the glue between the CLI and the trainer.

A run directory resumes with the config it was started with. ``--set`` may change what can
change mid-run (how long it runs, checkpointing, logging, sampling, the held-out eval, the
device); everything the checkpoint or the data order depends on is refused with the reason. The
accepted changes are appended to RUN_DIR/config_changes.jsonl with the step they apply from, and
config.yaml is rewritten (atomically) to the new config.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpokit.config import (
    GRPOKitConfig,
    check_machine,
    load_config,
    read_config_data,
    validate_config,
)
from grpokit.errors import UserError
from grpokit.train.run_lock import run_lock

if TYPE_CHECKING:
    from grpokit.monitor.trackers import ReportBuilder
    from grpokit.train.no_signal import Advice
    from grpokit.train.trainer import TrainResult

# The trainer (torch, transformers: seconds to import) is imported once the config and the run
# directory have passed their checks, so that a mistyped key or path fails at once.

CHANGES_FILE = "config_changes.jsonl"

RESUMABLE = (
    "training.max_steps",
    "training.num_train_epochs",
    "training.save_*",
    "training.load_best_model_at_end",
    "training.early_stopping_*",
    "training.logging_steps",
    "training.report_to",
    "training.log_completions*",
    "training.num_completions_to_print",
    "training.eval_*",
    "training.temperature",
    "training.top_p",
    "training.top_k",
    "training.min_p",
    "training.repetition_penalty",
    "training.generation_kwargs",
    "training.max_completion_length",
    "training.mask_truncated_completions",
    "training.epsilon",
    "training.epsilon_high",
    "training.delta",
    "training.max_grad_norm",
    "training.dynamic_sampling",
    "training.max_dynamic_sampling_rounds",
    "training.max_tokens_per_micro_batch",
    "training.logprob_chunk_size",
    "training.padding_free",
    "training.gradient_checkpointing",
    "training.use_vllm",
    "training.vllm_*",
    "model.gradient_checkpointing",
    "model.device",
    "model.cpu_matmul",
    "model.return_freed_memory",
    "data.heldout",
    "monitors",
)
"""Config keys (dotted, fnmatch patterns; a section covers its keys) that may change when a
run resumes: none of them is part of the checkpoint's state or of the data order."""

_FROZEN_WHY = (
    ("model.", "the checkpoint holds this model's weights (and adapter shape)"),
    ("training.num_generations", "the batch shape and the position in the data depend on it"),
    ("training.per_device", "the batch shape and the position in the data depend on it"),
    ("training.gradient_accumulation", "the batch shape and the position in the data depend on it"),
    ("training.num_processes", "the batch shape and the position in the data depend on it"),
    ("training.seed", "the data order and the random state come from it"),
    ("data.", "the data order and the position in it depend on it"),
    ("rewards", "it is the objective: rewards before and after would not compare"),
    ("training.beta", "it is the objective (and decides whether a reference model is held)"),
    ("training.metric_for_best_model", "the best checkpoint recorded so far was chosen by it"),
    ("training.greater_is_better", "the best checkpoint recorded so far was chosen by it"),
    ("training.", "the optimizer, scheduler or loss state of the checkpoint was built with it"),
)


def _check_can_run(cfg: GRPOKitConfig, source: Path) -> None:
    """What fails for this machine or model before anything is loaded: the device, the
    optimizer's package, and lengths beyond the model's context."""
    from grpokit.models.loading import check_context_length

    try:
        check_machine(cfg)
        check_context_length(
            cfg.model.name_or_path,
            max_prompt_length=cfg.training.max_prompt_length,
            max_completion_length=cfg.training.max_completion_length,
        )
    except UserError as e:
        raise UserError(f"{source}: {e}") from None


def train_from_config(
    config: Path,
    overrides: list[str] | None = None,
    *,
    output_dir: Path | None = None,
    progress: bool = True,
    build_report: ReportBuilder | None = None,
    advise: Advice | None = None,
) -> TrainResult:
    """Train from a config file; ``build_report`` writes the HTML report the trackers upload,
    ``advise`` says what to do when steps have no learning signal (see :class:`GRPOTrainer`)."""
    cfg = load_config(config, overrides)
    _check_can_run(cfg, config)
    from grpokit.train.trainer import GRPOTrainer

    with run_lock((output_dir or cfg.output_dir).resolve()):
        trainer = GRPOTrainer(
            cfg, run_dir=output_dir, progress=progress, build_report=build_report, advise=advise
        )
        return trainer.train()


def _diff(old: Any, new: Any, key: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, old, new) where two dumped configs differ, sections compared key by key."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = dict.fromkeys([*old, *new])
        return [d for k in keys for d in _diff(old.get(k), new.get(k), f"{key}.{k}".strip("."))]
    entries = isinstance(old, list) and isinstance(new, list) and len(old) == len(new)
    if entries and any(isinstance(v, dict) for v in old):  # rewards: entry by entry
        pairs = enumerate(zip(old, new, strict=True))
        return [d for i, (a, b) in pairs for d in _diff(a, b, f"{key}.{i}")]
    return [] if old == new else [(key, old, new)]


def config_changes(old: GRPOKitConfig, new: GRPOKitConfig) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) for every setting that differs, in config order."""
    return _diff(old.model_dump(mode="json"), new.model_dump(mode="json"))


def _resumable(key: str) -> bool:
    return any(fnmatch.fnmatch(key, p) or key.startswith(p + ".") for p in RESUMABLE)


def _why_frozen(key: str) -> str:
    return next(why for prefix, why in _FROZEN_WHY if key.startswith(prefix))


def _record_changes(run_dir: Path, changes: list[tuple[str, Any, Any]], step: int) -> None:
    """Append the changes with the step they apply from (the trainer has rewritten
    config.yaml, atomically, to the new config)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with (run_dir / CHANGES_FILE).open("a", encoding="utf-8") as f:
        for key, old, new in changes:
            row = {"step": step, "key": key, "old": old, "new": new, "time": stamp}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def resume_run(
    run_dir: Path,
    overrides: list[str] | None = None,
    *,
    progress: bool = True,
    build_report: ReportBuilder | None = None,
    advise: Advice | None = None,
) -> TrainResult:
    """Continue a run from its latest checkpoint, with the config it was started with and the
    ``--set`` changes that can apply mid-run (see :data:`RESUMABLE`)."""
    cfg_path = run_dir / "config.yaml"
    info_path = run_dir / "run.json"
    if not cfg_path.is_file() or not info_path.is_file():
        shared = (
            "; on several machines the run directory must be on a filesystem every machine "
            "mounts at the same path"
            if os.environ.get("RANK", "0") != "0"
            else ""
        )
        raise UserError(
            f"{run_dir}: not a grpokit run directory (no config.yaml / run.json){shared}"
        )
    data, lines = read_config_data(cfg_path)
    # Relative paths in the config keep meaning what they meant when the run started.
    started_in = Path(json.loads(info_path.read_text())["config_dir"])
    saved = validate_config(copy.deepcopy(data), cfg_path, lines, config_dir=started_in)
    cfg = (
        validate_config(data, cfg_path, lines, overrides, config_dir=started_in)
        if overrides
        else saved
    )
    changes = config_changes(saved, cfg)
    frozen = [(k, old, new) for k, old, new in changes if not _resumable(k)]
    if frozen:
        listed = "; ".join(f"{k} ({old!r} -> {new!r}): {_why_frozen(k)}" for k, old, new in frozen)
        raise UserError(
            f"{run_dir}: cannot change when resuming: {listed}. To train with them, start a new "
            "run from a checkpoint: grpokit train CONFIG --set model.init_from="
            f"{run_dir}/checkpoint-N --output-dir NEW_DIR"
        )
    _check_can_run(cfg, cfg_path)
    from grpokit.train.trainer import GRPOTrainer

    with run_lock(run_dir.resolve()):
        trainer = GRPOTrainer(
            cfg,
            run_dir=run_dir,
            resume=True,
            progress=progress,
            build_report=build_report,
            advise=advise,
        )
        if changes and os.environ.get("RANK", "0") == "0":  # one writer under a launcher
            # From the step resumed at: the newest intact checkpoint's.
            _record_changes(run_dir, changes, trainer.state.global_step)
        return trainer.train()
