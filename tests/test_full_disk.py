"""A full disk, for real: a small tmpfs mounted as the run directory, or as the disk
replay's folder, filled during a run. The run stops with exit 1 and one line, what it
had written stays whole (the last good checkpoint loads, metrics rows parse), and once
space is freed a rerun finishes with no metrics row lost or duplicated."""

import subprocess
from pathlib import Path

import pytest

from dreamer.runtime import checkpoint
from tests.runs import (
    QUICK,
    UNTIL_STOPPED,
    Trainer,
    can_mount_tmpfs,
    fill,
    read_metrics,
    run_trainer,
    tmpfs,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not can_mount_tmpfs(), reason="mounting a tmpfs needs root"),
]
FAST = list(QUICK)


def error_line(text: str) -> str:
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


def resumes_to_the_end(logdir: Path, good: Path, tmp_path: Path, *overrides: str) -> None:
    """A rerun resumes from ``good`` and finishes 300 steps later; rows up to ``good``
    are kept as they were, none is duplicated and none missing."""
    step = checkpoint.load(good)["steps"]["env_steps"]
    kept = [row for row in read_metrics(logdir) if row["env_steps"] <= step]
    done = run_trainer(logdir, *FAST, *overrides, f"run.steps={step + 300}", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {good.name} at env step {step}" in done.stderr
    rows = read_metrics(logdir)
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(set(steps)) and steps[-1] == step + 300, steps
    assert max(b - a for a, b in zip([0, *steps], steps)) < 200, steps
    assert rows[: len(kept)] == kept
    assert checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"] == step + 300


def mlflow_steps(logdir: Path) -> list[int]:
    """The env steps of the ``updates`` metric in the run's MLflow store (SQLite)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{logdir / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs(client.search_experiments()[0].experiment_id)
    return [metric.step for metric in client.get_metric_history(run.info.run_id, "updates")]


def test_a_full_run_directory_stops_the_run_and_loses_nothing(tmp_path):
    """metrics.jsonl, TensorBoard and the MLflow store in the full directory."""
    pytest.importorskip("mlflow")
    with tmpfs(tmp_path / "run", "64m") as logdir:
        outputs = "logger.use=[jsonl,tensorboard,mlflow]"
        trainer = Trainer(
            logdir, *FAST, UNTIL_STOPPED, outputs, "run.save_every=3", log=tmp_path / "log"
        )
        trainer.wait_for("checkpoint written")
        trainer.wait_rows(2)
        filler = fill(logdir)
        assert trainer.wait(300) == 1, trainer.tail()
        line = error_line(trainer.text())
        # whichever failed first: a metrics or TensorBoard write, or the checkpoints
        assert "No space left on device" in line or "writes in a row failed" in line, line
        good = checkpoint.latest(logdir)
        checkpoint.load(good)  # whole: its checksum holds
        assert not list((logdir / "checkpoints").glob(".*.tmp")), "partial file left behind"
        logged = mlflow_steps(logdir)  # what the store holds is still readable
        assert logged and logged == sorted(logged), logged
        filler.unlink()
        resumes_to_the_end(logdir, good, tmp_path, outputs)


def test_failing_checkpoint_writes_stop_the_run_after_save_failures(tmp_path):
    """Room for metrics rows but not for a checkpoint: each write fails and is retried;
    ``run.save_failures`` of them in a row stop the run, the last good one kept."""
    with tmpfs(tmp_path / "run", "48m") as logdir:
        overrides = [UNTIL_STOPPED, "run.save_every=1", "run.save_failures=2"]
        trainer = Trainer(logdir, *FAST, *overrides, log=tmp_path / "log")
        trainer.wait_for("checkpoint written")
        filler = fill(logdir, leave=512 * 1024)  # a checkpoint needs more than this
        # a write under way while the disk filled may still have landed: the good one
        # is the newest whole checkpoint once the run stopped, whatever its speed
        written = trainer.text().count("checkpoint written")
        assert trainer.wait(300) == 1, trainer.tail()
        text = trainer.text()
        assert text.count("checkpoint written") <= written + 1, text[-3000:]
        good = checkpoint.latest(logdir)
        assert good is not None and text.count(f"checkpoint written: {good}") == 1
        line = error_line(text)
        assert "2 checkpoint writes in a row failed" in line, line
        assert f"a rerun resumes from {good.name}" in line, line
        after = text.split(f"checkpoint written: {good}")[1]
        assert after.count("retrying at the next interval") == 2, after[-3000:]
        filler.unlink()
        resumes_to_the_end(logdir, good, tmp_path)


def test_a_replay_folder_without_room_stops_at_its_first_write(tmp_path):
    """The disk replay's files are allocated in full at their first write: a folder
    without room is one line then, never a crash on a later write."""
    logdir = tmp_path / "run"
    with tmpfs(logdir / "replay", "256k") as folder:
        done = run_trainer(logdir, *FAST, "replay.storage=disk", "run.steps=600", timeout=300)
        assert done.returncode == 1, done.stderr[-3000:]
        line = error_line(done.stderr)
        assert line.startswith("error: replay: ") and "No space left on device" in line, line
        subprocess.run(["mount", "-o", "remount,size=256m", str(folder)], check=True)
        done = run_trainer(logdir, *FAST, "replay.storage=disk", "run.steps=600", timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        steps = [row["env_steps"] for row in read_metrics(logdir)]
        assert steps == sorted(set(steps)) and steps[-1] == 600, steps
