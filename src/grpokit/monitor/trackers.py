"""Experiment trackers beside TensorBoard: Weights & Biases and MLflow (``training.report_to``).

Each tracker is a :class:`~grpokit.monitor.sinks.MetricsSink`: it receives the same per-step
metric dicts as metrics.jsonl (the run's record of truth), the resolved config once at the start
(W&B config / MLflow params), and when the run closes, the run's files as artifacts: config.yaml,
metrics.jsonl and the HTML report with its plots (built then, as ``grpokit report`` does).

Where the data goes:

- W&B: the project ``$WANDB_PROJECT`` (default ``grpokit``), files under ``<run_dir>/wandb``.
  ``$WANDB_MODE`` decides online or offline; when it is unset and no API key is configured, the
  run is logged offline (upload it later with ``wandb sync``) instead of failing.
- MLflow: ``$MLFLOW_TRACKING_URI`` when set; otherwise a local store in the run directory
  (``<run_dir>/mlflow.db``, artifacts in ``<run_dir>/mlartifacts``; browse it with
  ``mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow.db``). Experiment
  ``$MLFLOW_EXPERIMENT_NAME`` (default ``grpokit``).

A resumed run continues the same tracker runs: their ids are kept in ``<run_dir>/trackers.json``.
The packages are optional (extras ``grpokit[wandb]``, ``grpokit[mlflow]``) and imported only here.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import netrc
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grpokit.errors import UserError
from grpokit.files import write_json
from grpokit.monitor.sinks import MetricsSink

TRACKERS: tuple[str, ...] = ("wandb", "mlflow")
"""The ``report_to`` names handled here (tensorboard lives in :mod:`grpokit.monitor.sinks`)."""

IDS_FILE = "trackers.json"
DEFAULT_PROJECT = "grpokit"
# MLflow limits (of its REST API and stores): params per batch and characters per param value.
_MLFLOW_PARAMS_PER_BATCH = 100
_MLFLOW_PARAM_CHARS = 6000


def missing_tracker_packages(report_to: Sequence[str]) -> None:
    """Raise :class:`UserError` now if a requested tracker's package is not installed, naming the
    extra to install (cheap: nothing is imported)."""
    for name in report_to:
        if name in TRACKERS and importlib.util.find_spec(name) is None:
            raise _missing(name)


def _missing(name: str) -> UserError:
    return UserError(
        f"training.report_to includes '{name}', but the {name} package is not installed. "
        f"Install the extra with: pip install 'grpokit[{name}]' (or remove '{name}' from "
        "training.report_to)."
    )


def _require(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise _missing(name) from exc


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config sections as dotted keys: ``{"training": {"beta": 0.0}}`` ->
    ``{"training.beta": 0.0}``. Lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_config(value, prefix=f"{name}."))
        else:
            out[name] = value
    return out


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics trackers can plot: numbers (NaN kept), not booleans, lists or texts."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


ReportBuilder = Callable[[Path], object]
"""Builds ``<run_dir>/report/report.html`` (``grpokit.evaluate.report.build_report``); passed in
by the ``train`` command through the trainer, since monitors and training sit below the report
that draws their metrics."""


def final_files(
    run_dir: Path, log: Callable[[str], None] = print, build_report: ReportBuilder | None = None
) -> list[tuple[Path, str]]:
    """The run's files worth keeping with a tracker run, as (file, folder in the artifact).

    With ``build_report``, the HTML report is (re)built when it is missing or older than
    metrics.jsonl; a failure to build it is reported and the other files are still returned.
    """
    files = [(run_dir / n, "") for n in ("config.yaml", "metrics.jsonl") if (run_dir / n).is_file()]
    report = run_dir / "report" / "report.html"
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        stale = not report.is_file() or report.stat().st_mtime < metrics.stat().st_mtime
        if stale and build_report is not None:
            try:
                build_report(run_dir)
            except Exception as exc:  # the report is a view; its failure must not lose the run
                log(f"trackers: could not build the HTML report ({exc}); uploading the rest")
    if report.is_file():
        files.extend((p, "report") for p in sorted(report.parent.iterdir()) if p.is_file())
    return files


def _wandb_api_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        hosts = netrc.netrc().hosts
    except (OSError, netrc.NetrcParseError):
        return False
    return any("wandb" in host for host in hosts)


class WandbSink:
    """Logs to a Weights & Biases run (see the module doc for where)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        config: Mapping[str, Any],
        run_name: str,
        run_id: str | None = None,
        log: Callable[[str], None] = print,
        build_report: ReportBuilder | None = None,
    ) -> None:
        wandb = _require("wandb")
        self._wandb = wandb
        self._run_dir = run_dir
        self._log = log
        self._build_report = build_report
        mode = os.environ.get("WANDB_MODE")
        if not mode:
            mode = "online" if _wandb_api_key_configured() else "offline"
            if mode == "offline":
                log(
                    "wandb: no API key configured; logging offline under "
                    f"{run_dir / 'wandb'} (upload later with `wandb sync`)"
                )
        try:
            self._run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
                name=run_name,
                dir=str(run_dir),
                config=dict(config),
                id=run_id,
                resume="allow" if run_id else None,
                mode=mode,
            )
        except Exception as exc:
            raise UserError(
                f"training.report_to: W&B could not start a run ({exc}). Check the login "
                "(`wandb login`) and the network, or log offline with WANDB_MODE=offline."
            ) from exc
        self.run_id: str = str(self._run.id)
        self._failed = False

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self._failed:
            return
        try:
            self._run.log(numeric_metrics(metrics), step=step)
        except Exception as exc:  # metrics.jsonl has the step; the tracker is a copy
            self._failed = True
            self._log(f"wandb: logging failed ({exc}); metrics continue in metrics.jsonl only")

    def close(self) -> None:
        try:
            files = final_files(self._run_dir, self._log, self._build_report)
            if files:
                name = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{self._run_dir.name}-files")
                artifact = self._wandb.Artifact(name, type="grpokit-run")
                for path, folder in files:
                    artifact.add_file(str(path), name=f"{folder}/{path.name}" if folder else None)
                self._run.log_artifact(artifact)
        finally:
            self._run.finish()


def _mlflow_key(key: str) -> str:
    # MLflow accepts letters, digits, _ - . / and spaces in metric names.
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", key)


class MlflowSink:
    """Logs to an MLflow run (see the module doc for where)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        config: Mapping[str, Any],
        run_name: str,
        run_id: str | None = None,
        log: Callable[[str], None] = print,
        build_report: ReportBuilder | None = None,
    ) -> None:
        _require("mlflow")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._run_dir = run_dir
        self._log = log
        self._build_report = build_report
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        local = not uri
        if local:
            uri = f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.tracking_uri: str = str(uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        try:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
            experiment = self._client.get_experiment_by_name(name)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                location = (run_dir / "mlartifacts").resolve().as_uri() if local else None
                experiment_id = self._client.create_experiment(name, artifact_location=location)
        except Exception as exc:
            raise UserError(
                f"training.report_to: MLflow at '{self.tracking_uri}' could not open the "
                f"experiment '{name}' ({exc}). Check MLFLOW_TRACKING_URI (unset it to log into "
                "the run directory)."
            ) from exc
        self.run_id: str = ""
        if run_id:
            try:
                self._client.get_run(run_id)
                self._client.update_run(run_id, status="RUNNING")
                self.run_id = run_id
            except Exception:
                log(f"mlflow: run {run_id} of {IDS_FILE} not found; starting a new run")
        if not self.run_id:
            run = self._client.create_run(
                experiment_id, run_name=run_name, tags={"grpokit.run_dir": str(run_dir)}
            )
            self.run_id = run.info.run_id
            params = [
                Param(_mlflow_key(k), json.dumps(v) if not isinstance(v, str) else v)
                for k, v in flatten_config(config).items()
            ]
            params = [Param(p.key, p.value[:_MLFLOW_PARAM_CHARS]) for p in params]
            for start in range(0, len(params), _MLFLOW_PARAMS_PER_BATCH):
                chunk = params[start : start + _MLFLOW_PARAMS_PER_BATCH]
                self._client.log_batch(self.run_id, params=chunk)
        self._failed = False

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        if self._failed:
            return
        stamp = int(time.time() * 1000)
        batch = [
            Metric(_mlflow_key(k), v, stamp, step)
            for k, v in numeric_metrics(metrics).items()
            if not math.isinf(v)
        ]
        try:
            if batch:
                self._client.log_batch(self.run_id, metrics=batch)
        except Exception as exc:  # metrics.jsonl has the step; the tracker is a copy
            self._failed = True
            self._log(f"mlflow: logging failed ({exc}); metrics continue in metrics.jsonl only")

    def close(self) -> None:
        try:
            for path, folder in final_files(self._run_dir, self._log, self._build_report):
                self._client.log_artifact(self.run_id, str(path), artifact_path=folder or None)
        finally:
            self._client.set_terminated(self.run_id)


_SINKS: dict[str, type[WandbSink] | type[MlflowSink]] = {"wandb": WandbSink, "mlflow": MlflowSink}


def tracker_sinks(
    report_to: Sequence[str],
    *,
    run_dir: Path,
    config: Mapping[str, Any],
    resume: bool = False,
    log: Callable[[str], None] = print,
    build_report: ReportBuilder | None = None,
) -> list[MetricsSink]:
    """The tracker sinks ``report_to`` asks for (names other than wandb / mlflow are ignored).

    With ``resume``, the tracker runs recorded in ``<run_dir>/trackers.json`` are continued;
    ``build_report`` builds the HTML report uploaded with the run's files at the end.
    """
    wanted = [name for name in TRACKERS if name in report_to]
    if not wanted:
        return []
    missing_tracker_packages(wanted)
    ids_path = run_dir / IDS_FILE
    ids: dict[str, str] = {}
    if resume and ids_path.is_file():
        try:
            loaded = json.loads(ids_path.read_text(encoding="utf-8"))
            ids = {k: str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            ids = {}
    sinks: list[WandbSink | MlflowSink] = []
    try:
        for name in wanted:
            sink = _SINKS[name](
                run_dir,
                config=config,
                run_name=run_dir.name,
                run_id=ids.get(name),
                log=log,
                build_report=build_report,
            )
            sinks.append(sink)
            ids[name] = sink.run_id
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    write_json(ids_path, ids)
    return list(sinks)
