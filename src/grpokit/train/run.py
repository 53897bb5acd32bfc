"""Starting and resuming runs: the glue between the CLI and the trainer."""

from __future__ import annotations

import json
from pathlib import Path

from grpokit.config import load_config
from grpokit.errors import UserError
from grpokit.train.trainer import GRPOTrainer, TrainResult


def train_from_config(
    config: Path,
    overrides: list[str] | None = None,
    *,
    output_dir: Path | None = None,
    progress: bool = True,
) -> TrainResult:
    cfg = load_config(config, overrides)
    trainer = GRPOTrainer(cfg, run_dir=output_dir, progress=progress)
    return trainer.train()


def resume_run(run_dir: Path, *, progress: bool = True) -> TrainResult:
    """Continue a run from its latest checkpoint, with the config it was started with."""
    cfg_path = run_dir / "config.yaml"
    info_path = run_dir / "run.json"
    if not cfg_path.is_file() or not info_path.is_file():
        raise UserError(f"{run_dir}: not a grpokit run directory (no config.yaml / run.json)")
    cfg = load_config(cfg_path)
    # Relative paths in the config keep meaning what they meant when the run started.
    cfg._config_dir = Path(json.loads(info_path.read_text())["config_dir"])
    trainer = GRPOTrainer(cfg, run_dir=run_dir, resume=True, progress=progress)
    return trainer.train()
