"""kill -9 the trainer at five random moments (one of them inside a checkpoint write):
every rerun resumes, nothing is lost or duplicated, and the run finishes."""

import json
import os
import random
import signal
import subprocess
import sys
import time

from dreamer import checkpoint
from tests.runs import alive, descendants, read_metrics
from tests.test_resume import FAST

STEPS = 1500


def start(logdir, log):
    command = [
        sys.executable,
        "-m",
        "dreamer.train",
        *FAST,
        f"run.steps={STEPS}",
        "run.train_ratio=4",  # few updates: this test is about surviving kills
        "run.save_every=1",
        "replay.storage=disk",
        f"run.logdir={logdir}",
        "run.progress=false",
    ]
    return subprocess.Popen(command, stderr=log, stdout=log)


def rows_after(logdir, step: int) -> bool:
    """Has the run logged a metrics row past env step ``step``?"""
    path = logdir / "metrics.jsonl"
    if not path.exists():
        return False
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["env_steps"] > step:
                return True
        except ValueError:  # a line being written
            pass
    return False


def test_kill_9_at_random_moments_loses_nothing(tmp_path):
    rng = random.Random(20261129)
    logdir = tmp_path / "run"
    checkpoints = [0]
    for moment in range(5):
        with open(tmp_path / f"run{moment}.log", "w") as log:
            process = start(logdir, log)
            deadline = time.monotonic() + 300
            # it resumed (rows a killed run left past its checkpoint are gone by the time
            # it says "training") and made progress
            log_path = tmp_path / f"run{moment}.log"
            while "training" not in log_path.read_text() or not rows_after(logdir, checkpoints[-1]):
                assert process.poll() is None, (tmp_path / f"run{moment}.log").read_text()[-3000:]
                assert time.monotonic() < deadline
                time.sleep(0.2)
            if moment == 2:  # inside a checkpoint write: freeze it there, then kill
                folder = checkpoint.checkpoint_dir(logdir)
                while True:
                    while not list(folder.glob(".*.tmp")):
                        assert time.monotonic() < deadline and process.poll() is None
                        time.sleep(0.0005)
                    os.kill(process.pid, signal.SIGSTOP)
                    if list(folder.glob(".*.tmp")):  # still writing: kill it right there
                        children = descendants(process.pid)
                        os.kill(process.pid, signal.SIGKILL)
                        break
                    os.kill(process.pid, signal.SIGCONT)  # the write ended meanwhile
                partial = list(folder.glob(".*.tmp"))
            else:
                time.sleep(rng.uniform(0, 5))
                children = descendants(process.pid)
                os.kill(process.pid, signal.SIGKILL)
            assert process.wait(30) == -signal.SIGKILL
            # env workers, the inference server, the eval process and the render pool
            # all exit with it
            assert children
            gone_by = time.monotonic() + 30
            while any(map(alive, children)) and time.monotonic() < gone_by:
                time.sleep(0.2)
            assert not any(map(alive, children)), [p for p in children if alive(p)]
        if moment == 2:
            assert partial and all(path.exists() for path in partial)
        found = checkpoint.latest(logdir)  # none yet if killed within the first second
        step = checkpoint.load(found)["steps"]["env_steps"] if found else 0
        checkpoints.append(step)
        assert checkpoints[-1] >= checkpoints[-2], "a checkpoint went back in time"
    print(f"checkpoint env steps after each kill: {checkpoints[1:]}")
    with open(tmp_path / "final.log", "w") as log:
        final = start(logdir, log)
        assert final.wait(600) == 0, (tmp_path / "final.log").read_text()[-3000:]
    final_log = (tmp_path / "final.log").read_text()
    assert not list(checkpoint.checkpoint_dir(logdir).glob(".*.tmp")), "partial write left"
    assert "a checkpoint write a crash interrupted" in (tmp_path / "run3.log").read_text()
    assert f"at env step {checkpoints[-1]}" in final_log
    assert checkpoints[-1] > 0, "the killed runs made no progress"
    rows = read_metrics(logdir)
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(set(steps)) and steps[-1] == STEPS
    for counter in ("updates", "policy_version", "episodes"):
        values = [row[counter] for row in rows]
        assert values == sorted(values), f"{counter} went back"
    assert checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"] == STEPS
