"""kill -9 the trainer at three random moments (one of them inside a checkpoint write):
every rerun resumes, nothing is lost or duplicated, and the run finishes."""

import os
import random
import signal
import time

import pytest

from dreamer.runtime import checkpoint
from tests.runs import QUICK, UNTIL_STOPPED, Trainer, all_gone, read_metrics

pytestmark = pytest.mark.slow

KILLS = 3
IN_A_WRITE = 1  # the kill that lands inside a checkpoint write
RUN = [*QUICK, "run.save_every=1", "replay.storage=disk"]


def kill_inside_a_checkpoint_write(trainer: Trainer, deadline: float) -> tuple[set, list]:
    """Stop the trainer while a checkpoint's temporary file exists, then kill it there."""
    folder = checkpoint.checkpoint_dir(trainer.logdir)
    while True:
        while not list(folder.glob(".*.tmp")):
            assert time.monotonic() < deadline and trainer.process.poll() is None
            time.sleep(0.0005)
        os.kill(trainer.pid, signal.SIGSTOP)
        if partial := list(folder.glob(".*.tmp")):  # still writing: kill it right there
            return trainer.kill(), partial
        os.kill(trainer.pid, signal.SIGCONT)  # the write ended meanwhile


def test_kill_9_at_random_moments_loses_nothing(tmp_path):
    rng = random.Random(20261129)
    logdir = tmp_path / "run"
    checkpoints = [0]
    for moment in range(KILLS):
        # killed whatever its speed: it would run until stopped
        trainer = Trainer(logdir, *RUN, UNTIL_STOPPED, log=tmp_path / f"run{moment}.log")
        # it resumed (rows a killed run left past its checkpoint are gone by the time
        # it says "training") and made progress
        trainer.wait_for("training")
        trainer.wait_rows(past=checkpoints[-1])
        if moment == IN_A_WRITE:
            children, partial = kill_inside_a_checkpoint_write(trainer, time.monotonic() + 300)
        else:
            time.sleep(rng.uniform(0, 5))
            children = trainer.kill()
        assert trainer.wait(30) == -signal.SIGKILL
        # env workers, the inference server, the eval process and the render pool
        # all exit with it
        assert children
        assert all_gone(children) == []
        if moment == IN_A_WRITE:
            assert partial and all(path.exists() for path in partial)
        found = checkpoint.latest(logdir)  # none yet if killed within the first second
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
