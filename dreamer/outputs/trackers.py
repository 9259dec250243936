"""Experiment trackers (``logger=[jsonl,tensorboard,mlflow,wandb]``) on torchrl's loggers.

Each tracker gets the ``metrics.jsonl`` rows, the evaluation videos and figures, and the
resolved config, sent from a thread of its own so that a slow or unreachable tracker
never holds up training: its first failure logs one warning and drops it for the run.
Its run id is kept in ``<run.logdir>/trackers.json``: a resumed run logs to the same run."""

from __future__ import annotations

import json
import logging
import math
import netrc
import os
import queue
import threading
import uuid
from pathlib import Path

from dreamer import torchrl_compat as compat
from dreamer.config import flatten
from dreamer.runtime.files import replace_text

log = logging.getLogger(__name__)

IDS_FILE = "trackers.json"
CLOSE_TIMEOUT_S = 30.0  # what the end of a run waits for a tracker's pending items
# MLflow retries a lost server 7 times with backoff by default (minutes): give up sooner
MLFLOW_RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}


def _ids(logdir: Path) -> dict:
    path = logdir / IDS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _save_id(logdir: Path, name: str, run_id: str) -> None:
    ids = _ids(logdir) | {name: run_id}
    replace_text(logdir / IDS_FILE, json.dumps(ids, indent=1) + "\n")


def scalars(row: dict) -> dict[str, float]:
    return {
        key: float(value)
        for key, value in row.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


class Tracker:
    """A torchrl logger (``self.logger``, made by ``start``) resuming this run's earlier
    run (``run_id``) of the tracker named ``name``."""

    name: str

    def __init__(self, logdir: Path, cfg):
        self.logdir, self.cfg = logdir, cfg
        self.run_id = _ids(logdir).get(self.name)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.logger.log_metrics(values, step=step)


class MlflowTracker(Tracker):
    """torchrl's ``MLFlowLogger``."""

    name = "mlflow"

    def __init__(self, logdir: Path, cfg):
        for key, value in MLFLOW_RETRIES.items():
            os.environ.setdefault(key, value)
        super().__init__(logdir, cfg)

    def start(self, params: dict) -> str:
        uri, artifacts = self.cfg["uri"], None
        if not uri:  # MLflow >= 3.13 refuses plain-file stores: a SQLite file in the run dir
            store = (self.logdir / "mlflow").resolve()
            store.mkdir(parents=True, exist_ok=True)
            uri, artifacts = f"sqlite:///{store / 'mlflow.db'}", (store / "artifacts").as_uri()
        resume_id = self.run_id
        logger = compat.mlflow_logger(resume_id)
        self.logger = logger(self.cfg["experiment"], uri, artifact_location=artifacts)
        self.run_id = self.logger.experiment.info.run_id
        if resume_id is None:
            self.logger.log_hparams({key: str(value) for key, value in flatten(params).items()})
        return self.run_id

    def file(self, path: Path, folder: str) -> None:
        import mlflow

        mlflow.log_artifact(str(path), artifact_path=folder)

    def close(self) -> None:
        import mlflow

        mlflow.end_run()


class WandbTracker(Tracker):
    """torchrl's ``WandbLogger``; offline (files under ``<run.logdir>/wandb``, ``wandb
    sync`` uploads them later) unless an API key is set or ``logger.wandb.mode=online``."""

    name = "wandb"

    def __init__(self, logdir: Path, cfg):
        super().__init__(logdir, cfg)
        self.offline = cfg["mode"] == "offline" or (cfg["mode"] == "auto" and not has_wandb_key())

    def start(self, params: dict) -> str:
        from torchrl.record.loggers.wandb import WandbLogger

        self.run_id = self.run_id or uuid.uuid4().hex[:8]
        self.logger = WandbLogger(
            self.logdir.name,
            offline=self.offline,
            save_dir=str(self.logdir),
            id=self.run_id,
            project=self.cfg["project"],
            entity=self.cfg["entity"],
            mode="offline" if self.offline else "online",
            config=params,
            log_env_packages=False,
        )
        return self.run_id

    def file(self, path: Path, folder: str) -> None:
        import wandb

        media = wandb.Image(str(path)) if path.suffix == ".png" else wandb.Video(str(path))
        self.logger.experiment.log({f"{folder}/{path.stem}": media})

    def close(self) -> None:
        self.logger.experiment.finish()


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


TRACKERS = {"mlflow": MlflowTracker, "wandb": WandbTracker}


class TrackerThread:
    """One tracker, fed through a queue by the training loop and sending from a thread."""

    def __init__(self, tracker, logdir: Path, params: dict):
        self.tracker = tracker
        self.logdir = logdir
        self.params = params
        self.items: queue.Queue = queue.Queue()
        self.failed = False
        self.thread = threading.Thread(
            target=self._run, name=f"tracker-{tracker.name}", daemon=True
        )
        self.thread.start()

    def metrics(self, step: int, row: dict) -> None:
        if not self.failed:
            self.items.put(("metrics", step, scalars(row)))

    def file(self, path: Path) -> None:
        if not self.failed:
            try:
                folder = str(path.parent.relative_to(self.logdir))  # e.g. eval/000000001000
            except ValueError:
                folder = path.parent.name
            self.items.put(("file", path, folder))

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        self.items.put(("close",))
        self.thread.join(timeout)
        if self.thread.is_alive():
            log.warning(
                "%s: %d items not sent after %.0f s; metrics.jsonl has them",
                self.tracker.name,
                self.items.qsize(),
                timeout,
            )

    def _run(self) -> None:
        try:
            run_id = self.tracker.start(self.params)
            _save_id(self.logdir, self.tracker.name, run_id)
            log.info("%s: logging to run %s", self.tracker.name, run_id)
        except Exception as error:  # noqa: BLE001 - a tracker must not end the run
            self._fail(error)
        while True:
            item = self.items.get()
            if item[0] == "close":
                break
            if self.failed:
                continue
            try:
                if item[0] == "metrics":
                    self.tracker.metrics(item[1], item[2])
                else:
                    self.tracker.file(item[1], item[2])
            except Exception as error:  # noqa: BLE001
                self._fail(error)
        if not self.failed:
            try:
                self.tracker.close()
            except Exception as error:  # noqa: BLE001
                self._fail(error)

    def _fail(self, error: Exception) -> None:
        self.failed = True
        detail = " ".join(str(error).split())[:300] or type(error).__name__
        log.warning(
            "%s is unreachable (%s); training goes on without it, metrics.jsonl has everything",
            self.tracker.name,
            detail,
        )


def start_trackers(names, logdir: Path, logger_cfg, params: dict) -> list[TrackerThread]:
    """A thread per tracker in ``names`` (``logger.use``) that has one here (their extras
    were checked by ``dreamer.train`` before torch loaded: ``config.check_trackers``)."""
    return [
        TrackerThread(TRACKERS[name](logdir, logger_cfg[name]), logdir, params)
        for name in names
        if name in TRACKERS
    ]
