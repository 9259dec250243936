"""kill -9 the trainer inside a replay chunk write, inside a checkpoint's replay tail
write and inside the checkpoint write itself (the run kills itself there:
``DREAMER_STOP_AT``, no race with the write): each rerun restores exactly the replay of
the checkpoint it resumes from (digest, generator and counters as the killed run logged
them when it saved that checkpoint: nothing lost, nothing duplicated), and the run
finishes with no metrics row lost or duplicated."""

import re
import signal
from pathlib import Path

import pytest

from dreamer.runtime import checkpoint, signals
from tests.runs import QUICK, UNTIL_STOPPED, Trainer, read_metrics

pytestmark = pytest.mark.slow

# 2 streams of 200 steps: a chunk completes every 200 steps of a worker
RUN = [*QUICK, "replay.size=400", "run.save_every=1"]
# the replay logs its fingerprint at each checkpoint and resume
HOOKS = {"DREAMER_REPLAY_DEBUG": "1"}
SAVED = re.compile(r"replay at checkpoint step (\d+): (.+)")
RESTORED = re.compile(r"replay restored: (.+)")
MOMENTS = [  # the run kills itself (kill -9) inside the n-th such write: (moment, n, its file)
    ("replay_chunk_write", 2, "replay/stream*/.chunk-*.tmp"),
    ("replay_tail_write", 3, "replay/stream*/.tail-*.tmp"),  # the 2nd checkpoint's tails
    ("checkpoint_write", 2, "checkpoints/.*.tmp"),
]


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_kill_9_inside_replay_and_checkpoint_writes_restores_the_saved_replay(storage, tmp_path):
    logdir = tmp_path / "run"
    run = [*RUN, f"replay.storage={storage}"]
    saved: dict[int, str] = {}  # env step -> the replay's fingerprint when it was saved
    for number, (moment, nth, pattern) in enumerate(MOMENTS):
        stop = {signals.STOP_AT: f"{moment}:SIGKILL:{nth}"}
        trainer = Trainer(
            logdir, *run, UNTIL_STOPPED, log=tmp_path / f"run{number}.log", env=HOOKS | stop
        )
        assert trainer.wait(300) == -signal.SIGKILL, trainer.tail()
        text = trainer.text()
        assert f"SIGKILL at {moment}" in text
        check_restored(text, saved, logdir)
        assert list(logdir.glob(pattern)), moment  # killed with the write under way
        saved |= {int(step): line for step, line in SAVED.findall(text)}
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
