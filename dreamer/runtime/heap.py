"""The frozen setup heap and GC accounting: ``gc.freeze()`` after setup keeps the full
collections the unpickler's allocations trigger (Python 3.12+) from re-traversing the
models, collector and replay."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator


class GcStats:
    """Seconds spent in, and number of, garbage collections per generation."""

    def __init__(self):
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]  # the longest pause of each generation's collections
        self.collections = [0, 0, 0]
        self.full_collection_s = 0.0  # the pause of a full collection as the loop began
        # read once, at the first row: gc.get_freeze_count() walks the frozen list (~50 ms)
        self.frozen_objects: int | None = None
        self._started: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation = info["generation"]
            pause = time.perf_counter() - self._started
            self.seconds[generation] += pause
            self.longest[generation] = max(self.longest[generation], pause)
            self.collections[generation] += 1
            self._started = None

    def metrics(self) -> dict[str, float]:
        if self.frozen_objects is None:
            self.frozen_objects = gc.get_freeze_count()
        result = {
            "gc/seconds": sum(self.seconds),
            "gc/frozen_objects": self.frozen_objects,
            "gc/full_collection_s": self.full_collection_s,
            "gc/gen2_longest_s": self.longest[2],
        }
        for generation in range(3):
            result[f"gc/gen{generation}_seconds"] = self.seconds[generation]
            result[f"gc/gen{generation}_collections"] = self.collections[generation]
        return result


@contextlib.contextmanager
def frozen_heap(freeze: bool = True) -> Iterator[GcStats]:
    """``gc.freeze()`` on entry (``freeze``), ``gc.unfreeze()`` on any exit; counts GC time
    inside, and times one full collection on entry (what each of the loop's costs)."""
    stats = GcStats()
    if freeze:  # no collection first (~0.2 s): the set-up's garbage stays till unfreeze
        gc.freeze()
    started = time.perf_counter()
    gc.collect()
    stats.full_collection_s = time.perf_counter() - started
    gc.callbacks.append(stats)
    try:
        yield stats
    finally:
        gc.callbacks.remove(stats)
        if freeze:
            gc.unfreeze()
