"""W&B (offline) and MLflow (local stores) receive the run's metrics, config and final report;
everything is read back from what the trackers wrote, with no network."""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpokit.config import load_config
from grpokit.errors import UserError
from grpokit.monitor.sinks import JsonlSink
from grpokit.monitor.trackers import (
    IDS_FILE,
    MlflowSink,
    flatten_config,
    missing_tracker_packages,
    numeric_metrics,
    tracker_sinks,
)

REWARDS = """
def letter_e(prompts, completions, **columns):
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [t.count("e") / max(1, len(t)) for t in texts]
"""


# ---- reading back what W&B wrote offline -------------------------------------------------------


def _wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a W&B transaction log (.wandb): a 7-byte file header, then 32 KiB blocks
    of chunks, each with a 7-byte header (checksum, length, kind: 1 full, 2 first, 3 middle,
    4 last); a block's tail shorter than a chunk header is padding."""
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


def read_wandb_offline(run_dir: Path) -> dict[str, Any]:
    """history (step -> metrics), config and artifact file paths of the offline runs in run_dir."""
    from wandb.proto import wandb_internal_pb2 as pb

    out: dict[str, Any] = {"history": {}, "config": {}, "artifacts": [], "run_ids": set()}
    for log in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for raw in _wandb_records(log):
            record = pb.Record()  # type: ignore[attr-defined]
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}  # fmt: skip
                out["history"].setdefault(int(items["_step"]), {}).update(items)
            elif kind == "run":
                out["run_ids"].add(record.run.run_id)
                for item in record.run.config.update:
                    out["config"][item.key] = json.loads(item.value_json)
            elif kind == "config":
                for item in record.config.update:
                    out["config"][item.key] = json.loads(item.value_json)
            elif kind == "artifact":
                out["artifacts"].extend(m.path for m in record.artifact.manifest.contents)
    return out


def mlflow_history(client: Any, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


# ---- pure helpers ------------------------------------------------------------------------------


def test_flatten_config_and_numeric_metrics() -> None:
    flat = flatten_config({"training": {"beta": 0.04, "report_to": ["wandb"]}, "seed": 1})
    assert flat == {"training.beta": 0.04, "training.report_to": ["wandb"], "seed": 1}
    metrics = {"reward": 0.5, "step_ok": True, "alerts": [{"rule": "x"}], "n": 3, "kl": math.nan}
    out = numeric_metrics(metrics)
    assert set(out) == {"reward", "n", "kl"} and math.isnan(out["kl"])


def test_missing_tracker_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: None if n == "mlflow" else real(n))
    with pytest.raises(UserError, match=r"pip install 'grpokit\[mlflow\]'"):
        missing_tracker_packages(["tensorboard", "mlflow"])
    missing_tracker_packages(["tensorboard", "none"])  # nothing optional asked: no error


# ---- MLflow's file store, at the sink level ----------------------------------------------------


def test_mlflow_file_store_holds_metrics_params_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient

    store = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it behind a flag
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "grpokit-test")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("training:\n  beta: 0.04\n")
    config = {"training": {"beta": 0.04, "loss_type": "dapo"}, "model": {"name_or_path": "m"}}
    jsonl = JsonlSink(run_dir / "metrics.jsonl")
    sink = MlflowSink(run_dir, config=config, run_name="run", log=print)
    for step in (1, 2, 3):
        record: dict[str, Any] = {
            "reward": step / 10,
            "rewards/e:mean": step,
            "alerts": [],
            "flag": True,
        }
        jsonl.log(step, record)
        sink.log(step, record)
    jsonl.close()
    sink.close()

    client = MlflowClient(tracking_uri=store)
    run = client.get_run(sink.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["training.beta"] == "0.04"
    assert run.data.params["training.loss_type"] == "dapo"
    assert mlflow_history(client, sink.run_id, "reward") == {1: 0.1, 2: 0.2, 3: 0.3}
    # Characters MLflow refuses in metric names are replaced, not dropped.
    assert mlflow_history(client, sink.run_id, "rewards/e_mean") == {1: 1.0, 2: 2.0, 3: 3.0}
    assert "flag" not in run.data.metrics
    names = {f.path for f in client.list_artifacts(sink.run_id)}
    assert {"config.yaml", "metrics.jsonl"} <= names


# ---- both trackers from a real training run ----------------------------------------------------


def _tiny_config(tmp_path: Path, tiny_model_dir: Path, **training: Any) -> Path:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "train.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"Say something about {w}."}) + "\n"
            for w in ("apples", "rivers", "stars", "trees")
        )  # fmt: skip
    )
    doc = {
        "model": {"name_or_path": str(tiny_model_dir), "device": "cpu"},
        "data": {"train": "train.jsonl"},
        "rewards": [{"type": "python", "name": "e", "function": "my_rewards.py:letter_e"}],
        "training": {
            "learning_rate": 1e-3,
            "num_generations": 4,
            "per_device_train_batch_size": 4,
            "max_completion_length": 6,
            "max_steps": 2,
            "seed": 0,
            "report_to": ["wandb", "mlflow"],
            "logging_steps": 1,
            "output_dir": "run",
            **training,
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_training_run_reaches_wandb_offline_and_local_mlflow_and_resumes_them(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    import torch
    from mlflow.tracking import MlflowClient

    from grpokit.evaluate.report import build_report
    from grpokit.monitor.sinks import read_metrics
    from grpokit.train.trainer import GRPOTrainer

    torch.set_num_threads(1)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)

    result = GRPOTrainer(
        load_config(_tiny_config(tmp_path, tiny_model_dir)),
        progress=False,
        build_report=build_report,
    ).train()
    run_dir = result.run_dir
    ids = json.loads((run_dir / IDS_FILE).read_text())
    records, _ = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]

    # W&B, read back from the offline transaction log.
    logged = read_wandb_offline(run_dir)
    assert logged["run_ids"] == {ids["wandb"]}
    for r in records:
        for key in ("reward", "loss", "frac_reward_zero_std", "rewards/e/mean"):
            assert logged["history"][r["step"]][key] == pytest.approx(r[key]), key
    assert logged["config"]["training"]["learning_rate"] == 1e-3
    assert logged["config"]["model"]["name_or_path"] == str(tiny_model_dir)
    assert {"config.yaml", "metrics.jsonl", "report/report.html"} <= set(logged["artifacts"])

    # MLflow, read back from the local store in the run directory.
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    run = client.get_run(ids["mlflow"])
    assert run.info.status == "FINISHED"
    assert run.data.params["training.learning_rate"] == "0.001"
    for key in ("reward", "loss", "rewards/e/mean"):
        assert mlflow_history(client, ids["mlflow"], key) == pytest.approx(
            {r["step"]: r[key] for r in records}
        ), key
    assert "report.html" in {
        Path(f.path).name for f in client.list_artifacts(ids["mlflow"], "report")
    }

    # Resuming continues the same tracker runs.
    cfg = load_config(_tiny_config(tmp_path, tiny_model_dir, max_steps=3))
    GRPOTrainer(
        cfg, run_dir=run_dir, resume=True, progress=False, build_report=build_report
    ).train()
    assert json.loads((run_dir / IDS_FILE).read_text()) == ids
    assert set(mlflow_history(client, ids["mlflow"], "reward")) == {1, 2, 3}
    again = read_wandb_offline(run_dir)
    assert again["run_ids"] == {ids["wandb"]} and 3 in again["history"]


def test_tracker_sinks_ignores_other_names(tmp_path: Path) -> None:
    assert tracker_sinks(["tensorboard", "none"], run_dir=tmp_path, config={}) == []
    assert not (tmp_path / IDS_FILE).exists()


def test_unreachable_mlflow_store_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://host/path")
    with pytest.raises(UserError, match="MLFLOW_TRACKING_URI"):
        tracker_sinks(["mlflow"], run_dir=tmp_path, config={})
    assert not (tmp_path / IDS_FILE).exists()
