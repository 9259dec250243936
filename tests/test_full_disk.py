"""A full disk, for real: a small tmpfs mounted as the run directory, or as the disk
replay's folder, filled during a run. The run stops with exit 1 and one line, what it
had written stays whole (the last good checkpoint loads, metrics rows parse), and once
space is freed a rerun finishes with no metrics row lost or duplicated."""

import re
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
    wait_until,
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
    # a metrics write the full disk cut leaves a torn last line, which the rerun drops
    kept = [row for row in read_metrics(logdir, live=True) if row["env_steps"] <= step]
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
        # the MLflow store holds the run, made apart from the rows, and metrics in it
        trainer.wait_for("mlflow: logging to run")
        wait_until(lambda: mlflow_steps(logdir), "metrics in MLflow's store", running=trainer)
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


REPLAY_HOOKS = {"DREAMER_REPLAY_DEBUG": "1"}  # the replay logs its fingerprint at saves


def saved_replay(text: str, step: int) -> str:
    """The replay's fingerprint the run logged when it saved its checkpoint at ``step``."""
    lines = re.findall(rf"replay at checkpoint step {step}: (.+)", text)
    assert lines, text[-3000:]
    return lines[-1]


def resumes_with_the_saved_replay(
    logdir: Path, step: int, fingerprint: str, overrides: list[str], tmp_path: Path
) -> None:
    """A rerun restores the replay saved with the checkpoint at ``step`` and finishes 300
    steps later, no metrics row lost or duplicated."""
    resumed = Trainer(
        logdir, *FAST, *overrides, f"run.steps={step + 300}", log=tmp_path / "rerun",
        env=REPLAY_HOOKS,
    )  # fmt: skip
    assert resumed.wait(300) == 0, resumed.tail()
    assert f"replay restored: {fingerprint}" in resumed.text()
    steps = [row["env_steps"] for row in read_metrics(logdir)]
    assert steps == sorted(set(steps)) and steps[-1] == step + 300, steps
    assert max(b - a for a, b in zip([0, *steps], steps)) < 200, steps


def test_a_full_disk_replay_folder_stops_the_run_at_a_chunk_write(tmp_path):
    """A disk replay's folder (a tmpfs) fills up: the next chunk that completes cannot
    be written, and the run stops with exit 1 and one line (never a SIGBUS: a chunk is
    mapped only once its file is whole); the last good checkpoint is kept, and once
    space is freed a rerun restores the replay it saved and finishes, no row lost."""
    logdir = tmp_path / "run"
    # chunks of 200 steps per stream; tails a failing save leaves unwritten are retried
    overrides = ["replay.storage=disk", "replay.size=400", "run.save_every=1"]
    with tmpfs(logdir / "replay", "8m") as folder:
        trainer = Trainer(
            logdir,
            *FAST,
            UNTIL_STOPPED,
            *overrides,
            "run.save_failures=1000",
            log=tmp_path / "log",
            env=REPLAY_HOOKS,
        )
        trainer.wait_for("checkpoint written")
        filler = fill(folder)
        assert trainer.wait(300) == 1, trainer.tail()
        text = trainer.text()
        line = error_line(text)
        assert line.startswith("error: replay: ") and "No space left on device" in line, line
        assert ".chunk-" not in line and "/chunk-" in line, line
        good = checkpoint.latest(logdir)
        step = checkpoint.load(good)["steps"]["env_steps"]
        assert not list(folder.rglob(".*.tmp")), "partial replay file left"
        filler.unlink()
        resumes_with_the_saved_replay(logdir, step, saved_replay(text, step), overrides, tmp_path)


def test_a_full_memory_replay_folder_fails_the_checkpoints_not_the_run_at_once(tmp_path):
    """A memory replay whose folder is full keeps its chunks in RAM; the checkpoints,
    which need them on disk, fail and are retried, ``run.save_failures`` in a row stop
    the run (exit 1, one line); the last good one resumes exactly."""
    logdir = tmp_path / "run"
    overrides = ["replay.size=400", "run.save_every=1"]
    with tmpfs(logdir / "replay", "8m") as folder:
        trainer = Trainer(
            logdir, *FAST, UNTIL_STOPPED, *overrides, "run.save_failures=2",
            log=tmp_path / "log", env=REPLAY_HOOKS,
        )  # fmt: skip
        trainer.wait_for("checkpoint written")
        filler = fill(folder)
        assert trainer.wait(300) == 1, trainer.tail()
        text = trainer.text()
        line = error_line(text)
        assert "2 checkpoint writes in a row failed" in line, line
        assert "not written: replay: " in line and "No space left on device" in line, line
        good = checkpoint.latest(logdir)
        assert f"a rerun resumes from {good.name}" in line, line
        step = checkpoint.load(good)["steps"]["env_steps"]
        filler.unlink()
        resumes_with_the_saved_replay(logdir, step, saved_replay(text, step), overrides, tmp_path)
