"""kill -9 the trainer at three moments (after a metrics row; inside a checkpoint write;
as a resumed run starts its collector): every rerun resumes, nothing is lost or
duplicated, and the run finishes. Each moment is the run's own: the test waits for its
line, or the run kills itself there (``DREAMER_STOP_AT``), never a moment it races."""

import signal

import pytest

from dreamer.runtime import checkpoint, signals
from tests import leaks
from tests.runs import QUICK, UNTIL_STOPPED, Trainer, all_gone, read_metrics

pytestmark = pytest.mark.slow

RUN = [*QUICK, "run.save_every=1", "replay.storage=disk"]
AFTER_A_ROW = None  # the test kills it once a row past the last checkpoint is written
MOMENTS = [AFTER_A_ROW, "checkpoint_write:SIGKILL:2", "collector_start:SIGKILL"]
IN_A_WRITE = 1  # the kill that lands inside a checkpoint write


def test_kill_9_at_three_moments_loses_nothing(tmp_path):
    logdir = tmp_path / "run"
    checkpoints = [0]
    for number, moment in enumerate(MOMENTS):
        mark = {"DREAMER_TEST_KILLED_RUN": str(number)}  # its children inherit it
        hook = {signals.STOP_AT: moment} if moment else {}
        trainer = Trainer(
            logdir, *RUN, UNTIL_STOPPED, log=tmp_path / f"run{number}.log", env=mark | hook
        )
        if moment is AFTER_A_ROW:
            trainer.wait_rows(past=checkpoints[-1])  # it made progress
            children = trainer.kill()
            assert children  # env workers, the inference server, the forkserver
        assert trainer.wait(300) == -signal.SIGKILL, trainer.tail()
        assert moment is AFTER_A_ROW or f"SIGKILL at {moment.split(':')[0]}" in trainer.text()
        # whatever it had started (some may be gone already) exits with it
        left = leaks.marked(*mark.popitem()) - {trainer.pid}
        assert all_gone(left) == []
        if number == IN_A_WRITE:
            assert list(checkpoint.checkpoint_dir(logdir).glob(".*.tmp"))  # left half written
        found = checkpoint.latest(logdir)
        step = checkpoint.load(found)["steps"]["env_steps"] if found else 0
        checkpoints.append(step)
        assert checkpoints[-1] >= checkpoints[-2], "a checkpoint went back in time"
    print(f"checkpoint env steps after each kill: {checkpoints[1:]}")
    steps = checkpoints[-1] + 500  # the last rerun goes on from there, then finishes
    final = Trainer(logdir, *RUN, f"run.steps={steps}", log=tmp_path / "final.log")
    assert final.wait(600) == 0, final.tail(3000)
    assert not list(checkpoint.checkpoint_dir(logdir).glob(".*.tmp")), "partial write left"
    assert (
        "a checkpoint write a crash interrupted"
        in (tmp_path / f"run{IN_A_WRITE + 1}.log").read_text()
    )
    assert f"at env step {checkpoints[-1]}" in final.text()
    assert checkpoints[-1] > 0, "the killed runs made no progress"
    rows = read_metrics(logdir)
    logged = [row["env_steps"] for row in rows]
    assert logged == sorted(set(logged)) and logged[-1] == steps
    for counter in ("updates", "policy_version", "episode/total"):
        values = [row[counter] for row in rows]
        assert values == sorted(values), f"{counter} went back"
    assert checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"] == steps
    # TensorBoard, read by its own reader, holds each step once: metrics.jsonl's
    assert tensorboard_steps(logdir, "updates") == [row["env_steps"] for row in rows]


def tensorboard_steps(logdir, key: str) -> list[int]:
    """The steps of ``key``'s scalars in the run's event files, as TensorBoard shows them
    (its reader drops what a resumed writer's purge step hides)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = {path.parent for path in (logdir / "tensorboard").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return [event.step for event in events.Scalars(key)]
