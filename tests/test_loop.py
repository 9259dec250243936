"""The training loop's bookkeeping: what a resume restores and what a metrics row
averages."""

import functools
import itertools
import random
import time

import numpy as np
import pytest
import torch

from dreamer import train
from dreamer.command_line import load
from dreamer.learning.learner import Learner
from dreamer.runtime import checkpoint
from dreamer.runtime.timing import LoopTimers
from dreamer.runtime.world import World
from dreamer.training.loop import RowClock
from dreamer.training.parts import build_parts
from tests.runs import QUICK, read_metrics

CARTPOLE = ["experiment=smoke", "env=cartpole", "eval.every=0"]


def rng_states() -> tuple:
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


@pytest.mark.slow
def test_the_driver_rng_after_start_up_is_the_checkpointed_one(tmp_path):
    """torchrl builds the acting policy in the driver when a collector starts (to probe
    the transport), and again for a replacement collector; neither may move the RNG a
    resume restored."""
    cfg = load(CARTPOLE)
    world, cpu = World(), torch.device("cpu")
    torch.manual_seed(11), np.random.seed(12), random.seed(13)
    state = build_parts(cfg, tmp_path / "first", world, cpu).registry.state_dict()
    saved = rng_states()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)  # a new process's own draws

    parts = build_parts(cfg, tmp_path / "resumed", world, cpu)
    parts.restore(cfg, state, world)
    try:
        parts.collector.start()
        after_start = rng_states()
        parts.collector.current.shutdown()
        parts.collector.replacements += 1  # as after a dead env worker
        parts.collector.start()
        after_replacement = rng_states()
    finally:
        parts.collector.shutdown()
    for restored in (after_start, after_replacement):
        assert torch.equal(restored[0], saved[0])
        assert np.array_equal(restored[1], saved[1])
        assert restored[2] == saved[2]


class KnownLosses(Learner):
    """A real learner whose reported loss is the number of its update."""

    def update(self, batch):
        super().update(batch)
        return {"known": torch.tensor(float(self.updates))}


@pytest.mark.slow
def test_a_metrics_row_holds_the_mean_of_its_interval(tmp_path):
    logdir = tmp_path / "run"
    overrides = [
        *CARTPOLE,
        "run.steps=600",
        "run.train_starts=200",
        "run.log_every=50",
        "run.progress=false",
    ]
    parts = functools.partial(build_parts, make_learner=KnownLosses)
    assert train.main([*overrides, f"run.logdir={logdir}"], parts) == 0  # in this process
    rows = read_metrics(logdir)
    checked = 0
    for previous, row in zip(rows, rows[1:]):
        first, last = previous["updates"] + 1, row["updates"]
        if last < first:
            assert "known" not in row  # no update in this interval
            continue
        assert row["known"] == (first + last) / 2, (previous, row)
        checked += last > first  # the last update alone would differ
    assert checked >= 3


@pytest.mark.slow
def test_a_checkpoint_written_as_an_evaluation_starts_holds_it_in_flight(tmp_path):
    """A checkpoint at the step an evaluation was triggered must carry that evaluation
    (a resumed run plays it again): written before the trigger, a kill before the next
    checkpoint lost it for good, since the resumed run's schedule is past its step."""
    logdir = tmp_path / "run"
    overrides = [*QUICK, "run.steps=640", "eval.every=200", "eval.episodes=1", "eval.max_steps=50"]
    # a checkpoint at every loop step, all kept
    overrides += ["run.save_every=0.001", "run.keep=1000", "run.progress=false"]
    assert train.main([*overrides, f"run.logdir={logdir}"]) == 0  # in this process
    evals = [row["env_steps"] for row in read_metrics(logdir, "eval")]
    assert evals  # others may be skipped while one runs
    for step in evals:
        state = checkpoint.load(logdir / "checkpoints" / f"checkpoint-{step:012d}.pt")
        assert state["evaluation"]["step"] == step, (step, state["evaluation"]["step"])


def test_a_rows_interval_ends_when_the_row_is_decided():
    """``time/wall_s`` spans the two decisions of a row, not the two moments its values
    were gathered: a first row that took longer to gather made the next row's interval
    read shorter than ``run.log_seconds`` (a loaded suite saw 1.967 s of 2). The row's
    ``timestamp`` is that decision's Unix time too, read in the same call: each clock is
    bracketed by its own readings (a VM steps its Unix clock: once it moved 82 ms against
    the monotonic one in a 16 s interval, so the two are never compared)."""
    should_log = RowClock(every=10**9, seconds=0.2, end=10**9, start=0)
    timers, walls, gather = LoopTimers(), [], [0.15, 0.0, 0.0]
    for step in itertools.count(1):
        unix, monotonic = time.time(), time.perf_counter()
        if should_log(step):
            assert unix <= should_log.timestamp <= time.time()
            assert monotonic <= should_log.last[1] <= time.perf_counter()
            time.sleep(gather[len(walls)])  # its values gathered (the first takes longest)
            walls.append(timers.flush(0, should_log.last[1])["time/wall_s"])
            if len(walls) == len(gather):
                break
        time.sleep(0.01)
    assert all(wall >= 0.2 for wall in walls[1:]), walls


def test_a_rows_gc_figures_do_not_walk_the_frozen_heap(monkeypatch):
    """``gc.get_freeze_count()`` walks the whole frozen list (~50 ms a metrics row in a
    smoke run): the count is taken once, at the freeze, and every row reports it."""
    import gc

    from dreamer.runtime import heap

    walk, counted = gc.get_freeze_count, []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: counted.append(walk()) or counted[-1])
    kept = [[] for _ in range(1000)]  # tracked objects, frozen with the rest
    with heap.frozen_heap() as stats:
        rows = [stats.metrics() for _ in range(3)]
    assert len(counted) == 1 and counted[0] >= len(kept)
    assert [row["gc/frozen_objects"] for row in rows] == counted * 3
