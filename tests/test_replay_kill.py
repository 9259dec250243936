"""kill -9 the trainer inside a replay chunk write, inside a checkpoint's replay tail
write and inside the checkpoint write itself: each rerun restores exactly the replay of
the checkpoint it resumes from (digest, generator and counters as the killed run logged
them when it saved that checkpoint: nothing lost, nothing duplicated), and the run
finishes with no metrics row lost or duplicated."""

import os
import re
import signal
import time
from pathlib import Path

import pytest

from dreamer.runtime import checkpoint
from tests.runs import QUICK, UNTIL_STOPPED, Trainer, read_metrics

pytestmark = pytest.mark.slow

# 2 streams of 200 steps: a chunk completes every 200 steps of a worker
RUN = [*QUICK, "replay.size=400", "run.save_every=1"]
# the replay logs its fingerprint at each checkpoint and resume; every replay file
# write is held 0.3 s before its fsync and rename, a window to kill it in
HOOKS = {"DREAMER_REPLAY_DEBUG": "1", "DREAMER_REPLAY_WRITE_DELAY": "0.3"}
SAVED = re.compile(r"replay at checkpoint step (\d+): (.+)")
RESTORED = re.compile(r"replay restored: (.+)")


def kill_inside(trainer: Trainer, pattern: str, deadline: float) -> list[Path]:
    """Stop the trainer while a file matching ``pattern`` (a temporary file of a write
    under way) exists, and kill it there; returns the files."""
    while True:
        while not list(trainer.logdir.glob(pattern)):
            assert time.monotonic() < deadline, f"no {pattern} in time:\n{trainer.tail()}"
            assert trainer.process.poll() is None, trainer.tail()
            time.sleep(0.002)
        os.kill(trainer.pid, signal.SIGSTOP)
        if partial := list(trainer.logdir.glob(pattern)):
            trainer.kill()
            return partial
        os.kill(trainer.pid, signal.SIGCONT)


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_kill_9_inside_replay_and_checkpoint_writes_restores_the_saved_replay(storage, tmp_path):
    logdir = tmp_path / "run"
    run = [*RUN, f"replay.storage={storage}"]
    saved: dict[int, str] = {}  # env step -> the replay's fingerprint when it was saved
    moments = [
        ("replay/stream*/.chunk-*.tmp", "a chunk write"),
        ("replay/stream*/.tail-*.tmp", "a checkpoint's replay tail"),
        ("checkpoints/.*.tmp", "a checkpoint write"),
    ]
    for number, (pattern, what) in enumerate(moments):
        trainer = Trainer(logdir, *run, UNTIL_STOPPED, log=tmp_path / f"run{number}.log", env=HOOKS)
        trainer.wait_for("training")
        check_restored(trainer.text(), saved, logdir)
        trainer.wait_for("checkpoint written")
        partial = kill_inside(trainer, pattern, time.monotonic() + 300)
        assert trainer.wait(30) == -signal.SIGKILL, what
        assert all(path.exists() for path in partial), what
        saved |= {int(step): line for step, line in SAVED.findall(trainer.text())}
    step = checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"]
    final = Trainer(logdir, *run, f"run.steps={step + 300}", log=tmp_path / "final.log", env=HOOKS)
    assert final.wait(600) == 0, final.tail(3000)
    check_restored(final.text(), saved, logdir)
    assert f"at env step {step}" in final.text()
    logged = [row["env_steps"] for row in read_metrics(logdir)]
    assert logged == sorted(set(logged)) and logged[-1] == step + 300
    assert max(b - a for a, b in zip([0, *logged], logged)) < 200, logged
    leftovers = [p for p in (logdir / "replay").rglob(".*.tmp")]
    assert not leftovers, f"partial replay files left: {leftovers}"


def check_restored(text: str, saved: dict[int, str], logdir: Path) -> None:
    """The run resumed from step N restored the replay the killed run saved at N."""
    resumed = re.search(r"resuming from checkpoint-\d+\.pt at env step (\d+)", text)
    if resumed is None:  # killed before its first checkpoint: a fresh start
        assert not saved, text[-3000:]
        return
    step = int(resumed[1])
    restored = RESTORED.search(text)
    assert restored, text[-3000:]
    assert restored[1] == saved[step], f"step {step}: restored {restored[1]}, saved {saved[step]}"
