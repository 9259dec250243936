"""Experiment trackers: MLflow against a real ``mlflow server`` on 127.0.0.1, wandb in
offline mode, both across a resume; a tracker that dies mid-run does not stop training."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dreamer.runtime import signals
from tests import leaks
from tests.runs import QUICK, UNTIL_STOPPED, Trainer, read_metrics, run_trainer, wait_until

mlflow = pytest.importorskip("mlflow")

FAST = [*QUICK, "eval.every=200", "eval.episodes=1", "eval.render_workers=0"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_mlflow_server(store: Path) -> tuple[str, subprocess.Popen]:
    """``mlflow server`` in a session of its own, once it answers; (uri, process)."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{store / 'mlflow.db'}",
            "--artifacts-destination",
            str(store / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # without its job runner (huey consumers for MLflow's own GenAI jobs, ~28 CPU-s
        # over these tests): a training run's tracking never asks the server for jobs
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    leaks.keep(server.pid)  # shared by this file's tests (tests/leaks.py)
    uri = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            assert server.poll() is None, "mlflow server exited"
            return False

    wait_until(healthy, "mlflow server answering", timeout=240, interval=0.25)
    return uri, server


@pytest.fixture(scope="module")
def mlflow_servers(tmp_path_factory):
    """The server this file's tests share (its start is most of a test's time); a new
    one once a test has killed it."""
    started = []

    def running() -> tuple[str, subprocess.Popen]:
        if not started or started[-1][1].poll() is not None:
            started.append(start_mlflow_server(tmp_path_factory.mktemp("mlflow")))
        return started[-1]

    yield running
    for _, server in started:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)  # the server and its workers
        server.wait()


@pytest.fixture
def mlflow_server(mlflow_servers):
    """(uri, process) of a running ``mlflow server``."""
    return mlflow_servers()


def tracked_run_id(logdir: Path, name: str) -> str:
    return json.loads((logdir / "trackers.json").read_text())[name]


def artifacts(client, run_id: str, folder: str | None = None) -> list[str]:
    found = []
    for entry in client.list_artifacts(run_id, folder):
        found += artifacts(client, run_id, entry.path) if entry.is_dir else [entry.path]
    return found


def check_mlflow_has_metrics_jsonl(client, run_id: str, logdir: Path) -> None:
    """Every finite metric of every metrics.jsonl row is in the MLflow run at its step
    (the row's ``timestamp`` is the file's own: MLflow times each value itself)."""
    rows = read_metrics(logdir, "all")
    keys = {k for row in rows for k, v in row.items() if isinstance(v, int | float)}
    assert "timestamp" in keys
    keys.discard("timestamp")
    assert {"env_steps", "loss_model_reco", "eval/return", "episode/return"} <= keys
    for key in ("env_steps", "eval/return", "loss_model_reco"):
        history = {(m.step, m.value) for m in client.get_metric_history(run_id, key)}
        wanted = {
            (row["env_steps"], float(row[key]))
            for row in rows
            if isinstance(row.get(key), int | float) and math.isfinite(row[key])
        }
        assert wanted and wanted <= history, key
    assert keys <= set(client.get_run(run_id).data.metrics)


@pytest.mark.slow
def test_mlflow_server_gets_metrics_params_and_eval_artifacts_across_a_resume(
    tmp_path, mlflow_server
):
    uri, _ = mlflow_server
    logdir = tmp_path / "run"
    tracked = ["logger=[jsonl,tensorboard,mlflow]", f"logger.mlflow.uri={uri}"]
    tracked.append(f"logger.mlflow.experiment={tmp_path.name}")  # its own on a shared server
    first = run_trainer(logdir, *FAST, *tracked, "run.steps=300")
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = tracked_run_id(logdir, "mlflow")
    client = mlflow.MlflowClient(uri)
    check_mlflow_has_metrics_jsonl(client, run_id, logdir)
    params = client.get_run(run_id).data.params
    assert params["run.steps"] == "300" and params["env.name"] == "cue"
    assert params["model.deter"] == "64"
    first_files = artifacts(client, run_id)
    assert first_files and all(f.startswith("eval/") for f in first_files)
    assert any(f.endswith("returns.png") for f in first_files)

    resumed = run_trainer(logdir, *FAST, *tracked, "run.steps=500")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert tracked_run_id(logdir, "mlflow") == run_id
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    check_mlflow_has_metrics_jsonl(client, run_id, logdir)
    steps = {m.step for m in client.get_metric_history(run_id, "env_steps")}
    assert max(steps) == 500 and min(steps) <= 300
    assert set(first_files) < set(artifacts(client, run_id))  # the resumed run's eval too


@pytest.mark.slow
def test_a_tracker_server_killed_mid_run_warns_once_and_training_finishes(tmp_path, mlflow_server):
    uri, server = mlflow_server
    logdir = tmp_path / "run"
    trainer = Trainer(
        logdir,
        *FAST,
        "eval.every=0",
        "logger=[jsonl,mlflow]",
        f"logger.mlflow.uri={uri}",
        UNTIL_STOPPED,
        log=tmp_path / "run.log",
    )
    trainer.wait_rows()
    wait_until(lambda: (logdir / "trackers.json").exists(), "trackers.json", running=trainer)
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    trainer.wait_for("mlflow is unreachable")
    # training goes on past the warning, with more rows to send that cannot be sent
    past = read_metrics(logdir, live=True)[-1]["env_steps"]
    trainer.wait_rows(2, past=past)
    assert trainer.stop() == signals.REQUEUE_EXIT, trainer.tail(3000)
    assert trainer.text().count("mlflow is unreachable") == 1, trainer.tail(3000)
    steps = [row["env_steps"] for row in read_metrics(logdir)]
    assert steps == sorted(set(steps)) and len(steps) >= 3, steps


BLOCK = 32768  # LevelDB log blocks, the layout of wandb's .wandb files


def wandb_history(path: Path) -> list[dict]:
    """The history rows of a .wandb file (LevelDB log records of wandb's protobufs)."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending, rows = path.read_bytes(), 7, b"", []  # 7: the file header
    while position + 7 <= len(data):
        left = BLOCK - position % BLOCK
        if left < 7:
            position += left
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
                )
    return rows


def test_wandb_offline_files_hold_the_metrics_and_a_resume_appends(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from dreamer.outputs.trackers import TrackerThread, WandbTracker

    for key in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a wandb key
    cfg = {"project": "dreamer", "entity": None, "mode": "auto"}
    rows = [{"env_steps": step, "loss_model_reco": step / 7} for step in (100, 200, 300, 400)]
    for part in (rows[:2], rows[2:]):  # a run, then its resume
        tracker = TrackerThread(WandbTracker(tmp_path, cfg), tmp_path, {"run": {"steps": 400}})
        assert tracker.tracker.offline
        for row in part:
            tracker.metrics(row["env_steps"], row)
        tracker.close()
        assert not tracker.failed
        # wandb names a run's directory by its start's whole second: a resume within the
        # same second reuses the first part's directory and file (a trainer needs seconds
        # to start, this loop does not)
        time.sleep(1.05 - time.time() % 1)
    run_id = tracked_run_id(tmp_path, "wandb")
    files = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 2, "the resume logs to the same run id"
    deadline = time.monotonic() + 30  # wandb's service process may still be writing
    while len(logged := [row for path in files for row in wandb_history(path)]) < len(rows):
        assert time.monotonic() < deadline, logged
        time.sleep(0.5)
    assert [(r["step"], r["env_steps"], r["loss_model_reco"]) for r in logged] == [
        (r["env_steps"], r["env_steps"], pytest.approx(r["loss_model_reco"])) for r in rows
    ]


def test_every_tracker_is_checked_for_its_extra_before_torch_loads():
    """``dreamer.train`` refuses a missing tracker from the config's list (no torch), the
    run starts them from its own table: the two name the same trackers, each a logger."""
    from dreamer.config import LOGGERS, TRACKER_EXTRAS
    from dreamer.outputs.trackers import TRACKERS

    assert set(TRACKERS) == set(TRACKER_EXTRAS) <= set(LOGGERS)
