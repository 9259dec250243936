"""Where the training loop's time goes: seconds per phase, per metrics interval and in
total, so a user can tell a collection-bound run from a learner-bound one."""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

log = logging.getLogger("dreamer")
PHASES = ("collect_wait", "sample", "update", "sync", "log", "eval")


class LoopTimers:
    """Ours rather than torchrl's ``timeit``: that is one process-wide registry, where
    the loop needs per-interval and whole-run sums side by side."""

    def __init__(self, updates: int = 0):
        self.started = self.flushed = time.perf_counter()
        self.updates = updates  # learner updates at the last flush
        self.interval = dict.fromkeys(PHASES, 0.0)
        self.total = dict.fromkeys(PHASES, 0.0)

    def add(self, phase: str, seconds: float) -> None:
        self.interval[phase] += seconds
        self.total[phase] += seconds

    @contextmanager
    def phase(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def waiting(self, items: Iterable, phase: str = "collect_wait") -> Iterator:
        """Yields from ``items``, timing each wait for the next one."""
        iterator = iter(items)
        while True:
            started = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self.add(phase, time.perf_counter() - started)
            yield item

    def flush(self, updates: int, now: float) -> dict[str, float]:
        """The interval's ``time/<phase>_s`` and ``time/wall_s`` (no phase: the driver's
        own work), and with updates in it (``updates``: the learner's count now) wall
        ``time/s_per_update`` beside the update's own ``time/update_s_per_update``. The
        interval ends ``now`` (``time.perf_counter``)."""
        metrics = {f"time/{name}_s": seconds for name, seconds in self.interval.items()}
        metrics["time/wall_s"] = now - self.flushed
        if (done := updates - self.updates) > 0:
            metrics["time/s_per_update"] = metrics["time/wall_s"] / done
            metrics["time/update_s_per_update"] = metrics["time/update_s"] / done
        self.updates = updates
        self.interval = dict.fromkeys(PHASES, 0.0)
        self.flushed = now
        return metrics

    def summary(self) -> str:
        wall = max(time.perf_counter() - self.started, 1e-9)
        shares = ", ".join(f"{name} {100 * s / wall:.0f}%" for name, s in self.total.items())
        other = 100 * (1 - sum(self.total.values()) / wall)
        return f"loop time: {wall:.0f} s; {shares}, other {other:.0f}%"


CPU_RUN_LENGTH = "about 40 min on 2 cores"
"""`experiment=dmc_proprio_cpu`'s wall time, said so wherever the run is named (README,
docs/envs.md, its YAML, the start note): the mean of ours' three reacher_easy seeds in
benchmarks/results/peers_learn_reacher_easy.json (tests/test_docs.py holds them equal)."""


class CpuSpeedNote:
    """Without a GPU, how long the run's updates will take: the median of the loop's
    first ``sample`` updates (timed beside paced collection, as the run goes on; the
    first allocates, or compiles) times the updates left."""

    sample = 5

    def __init__(self, cfg, enabled: bool, env_steps: int = 0):
        self.cfg = cfg
        self.env_steps = env_steps  # where this process starts (a resumed run: its step)
        self.seconds: list[float] | None = [] if enabled else None

    def __call__(self, seconds: float) -> None:
        if self.seconds is None:
            return
        self.seconds.append(seconds)
        if len(self.seconds) == self.sample:
            median = statistics.median(self.seconds)
            log.info(self.note(median, f"the median of the run's first {self.sample} updates"))
            self.seconds = None

    def updates(self) -> float:
        """Updates from this process's start to ``run.steps`` (none before train_starts)."""
        run, replay = self.cfg.run, self.cfg.replay
        trained = max(run.steps - max(run.train_starts, self.env_steps), 0)
        return trained * run.train_ratio / (replay.batch * replay.length)

    def note(self, seconds_per_update: float, how: str) -> str:
        updates = self.updates()
        seconds = updates * seconds_per_update
        note = (
            f"no GPU: a learner update takes {seconds_per_update:.3f} s on this CPU ({how}); "
            f"run.steps={self.cfg.run.steps} needs ~{updates:,.0f} more updates = "
            f"~{duration(seconds)} of learner time"
        )
        if seconds < 3600:  # a run of minutes (make smoke's own, say) is its own quick check
            return note + "."
        return note + (
            ". A real run that fits a CPU: `make train ARGS=experiment=dmc_proprio_cpu` "
            f"(DMC from proprioception, 50k env steps, {CPU_RUN_LENGTH}); "
            "a quick end-to-end check: `make smoke`."
        )


def since_launch() -> float:
    """Seconds since this process was launched (Linux), its imports included."""
    with open("/proc/self/stat") as stat:
        started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as uptime:
        return float(uptime.read().split()[0]) - started


class StartLine:
    """One line once the run is under way: how long after launch its first transitions
    and its first update came (a run's start is the first wait its user has)."""

    def __init__(self):
        self.transitions_at: float | None = None
        self.said = False

    def transitions(self) -> None:
        if self.transitions_at is None:
            self.transitions_at = since_launch()

    def updated(self, env_steps: int) -> None:
        if not self.said:
            self.said = True
            log.info(
                "under way: first transitions %.1f s, first update %.1f s after launch "
                "(env step %d)",
                self.transitions_at or 0.0,
                since_launch(),
                env_steps,
            )


def duration(seconds: float) -> str:
    """``seconds`` in the unit that keeps it readable: 45 s, 12 min, 3.4 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"
