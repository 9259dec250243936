"""Failures inside a run: envs that raise, an env worker killed with SIGKILL."""

import os
import re
import signal

import pytest

from dreamer.runtime import signals
from tests.runs import UNTIL_STOPPED, Trainer, all_gone, read_metrics

pytestmark = pytest.mark.slow

FAULTY = ["env=gym", "env.id=tests.faulty_env:Faulty-v0", "env.length=0"]


def test_failing_envs_and_a_killed_worker_do_not_end_the_run(tmp_path):
    logdir = tmp_path / "run"
    trainer = Trainer(
        logdir,
        "experiment=smoke",
        *FAULTY,
        UNTIL_STOPPED,
        "run.train_ratio=4",  # few updates: this test is about collection
        "eval.every=0",  # its stop came as smoke's evaluation at 1,000 started (a 2-min stall)
        "run.train_starts=200",
        "run.log_every=100",
        log=tmp_path / "run.log",
    )
    trainer.wait_rows()
    victim = int(trainer.wait_for(r"env worker pids: (\d+)"))
    os.kill(victim, signal.SIGKILL)
    trainer.wait_for("replacing the collector")
    trainer.wait_rows(past=1000)  # the run went on, through more injected env failures
    assert trainer.stop() == signals.REQUEUE_EXIT, trainer.tail()
    log = trainer.text()
    assert log.count("replacing the collector") == 1, log[-4000:]
    env_failures = len(re.findall(r"injected failure", log))
    assert env_failures >= 2  # each Faulty-v0 instance raises every 150 steps
    rows = read_metrics(logdir)
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(set(steps)) and steps[-1] > 1000
    # the replaced collector counts once; env failures count when their step arrives
    assert 2 <= rows[-1]["env/restarts"] <= env_failures + 1
    assert rows[-1]["updates"] > 0
    assert all_gone([victim], timeout=0) == []
