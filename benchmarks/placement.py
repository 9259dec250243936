"""Where the host has put this VM's two cores, read from the time a cache line takes
to pass between them.

    python benchmarks/placement.py [--seconds 60] [--every 1]

On the project's 2-core AMD EPYC VM the one-way latency between vCPU 0 and 1 flips,
every few seconds to minutes, between ~30-50 ns (a C ping-pong; the two on one core
complex, sharing an L3) and ~185-200 ns (on two complexes: every hand-over crosses the
fabric), as the host moves its threads. A two-thread update follows: 0.37-0.38 s per
compiled size1m vector update in the near placement, 0.46-0.50 s in the far one, in
one process that flipped mid-run (2026-12-05; benchmarks/README.md, "The run"). No
guest setting reaches it (pinning and libgomp's wait policy did not), so a two-thread
figure means little without the share of its time spent far: ``PlacementSampler``
records it beside a timed run.

This probe is Python (two processes spinning on one shared byte), so its figures carry
the interpreter's overhead: ~90-100 ns near, ~190-200 ns far; ``FAR_NS`` splits them.
Each sample takes both CPUs for ~5-10 ms.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time

FAR_NS = 150


def one_way_ns(rounds: int = 20_000) -> float:
    """One-way hand-over time (ns) of a byte bounced between two processes pinned to the
    first two usable CPUs: the median over chunks of up to 1,000 rounds (a chunk with a
    page fault or a preemption in it reads high)."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    chunk = max(1, min(1_000, rounds // 10))
    view = memoryview(mmap.mmap(-1, mmap.PAGESIZE))
    allowed = os.sched_getaffinity(0)
    child = os.fork()
    if child == 0:
        try:
            os.sched_setaffinity(0, {second})
            for _ in range(rounds):
                while view[0] != 1:
                    pass
                view[0] = 0
        finally:
            os._exit(0)
    try:
        os.sched_setaffinity(0, {first})
        chunks = []
        for _ in range(rounds // chunk):
            started = time.perf_counter()
            for _ in range(chunk):
                view[0] = 1
                while view[0] != 0:
                    pass
            chunks.append(time.perf_counter() - started)
    finally:
        os.waitpid(child, 0)
        os.sched_setaffinity(0, allowed)
    return statistics.median(chunks) / chunk / 2 * 1e9


class Probe:
    """``one_way_ns`` run by a helper process of its own, for a process under
    measurement: a fork of that process would mark its pages copy-on-write, and each
    first write to one after the child's exit faults (a one-thread update probed that
    way ran 0.74 s against 0.66-0.69)."""

    def __init__(self, rounds: int = 20_000):
        self.helper = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--rounds", str(rounds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __call__(self) -> float:
        self.helper.stdin.write("\n")
        self.helper.stdin.flush()
        return float(self.helper.stdout.readline())

    def close(self) -> None:
        self.helper.stdin.close()
        self.helper.wait()


def serve(rounds: int) -> int:
    """Answer each line on stdin with one probe."""
    for _ in sys.stdin:
        print(one_way_ns(rounds), flush=True)
    return 0


class PlacementSampler(threading.Thread):
    """A ``Probe`` every ``every`` seconds until ``stop``: ``samples`` holds (Unix time,
    ns), the clock of the trainer's metrics rows and update timeline."""

    def __init__(self, every: float = 1.0):
        super().__init__(daemon=True)
        self.every = every
        self.samples: list[tuple[float, float]] = []
        self.done = threading.Event()

    def run(self) -> None:
        probe = Probe()
        try:
            while not self.done.wait(self.every):
                self.samples.append((time.time(), probe()))
        finally:
            probe.close()

    def stop(self) -> None:
        self.done.set()
        self.join()


def summary(samples: list[float]) -> dict:
    """The share of samples in the far placement and the median of each placement."""
    far = [ns for ns in samples if ns > FAR_NS]
    near = [ns for ns in samples if ns <= FAR_NS]
    return {
        "far_share": len(far) / len(samples) if samples else None,
        "samples": len(samples),
        "near_ns": statistics.median(near) if near else None,
        "far_ns": statistics.median(far) if far else None,
    }


def where(*probes: float) -> str:
    """A timed span's placement from the probes around it (the one before, any inside,
    the one after): near or far if they all agree, else mixed (it moved, or may have,
    in between)."""
    places = {"far" if ns > FAR_NS else "near" for ns in probes}
    return places.pop() if len(places) == 1 else "mixed"


def by_placement(seconds: list[float], places: list[str]) -> dict:
    """The median of ``seconds`` in each placement and how many fell there."""
    out = {}
    for place in ("near", "far", "mixed"):
        these = [s for s, p in zip(seconds, places, strict=True) if p == place]
        out[place] = {"n": len(these), "s": statistics.median(these) if these else None}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--serve", action="store_true", help="(for Probe)")
    parser.add_argument("--rounds", type=int, default=20_000, help="hand-overs per probe")
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.rounds)
    if len(os.sched_getaffinity(0)) < 2:
        print("placement: needs two usable CPUs", file=sys.stderr)
        return 2
    end, samples = time.monotonic() + args.seconds, []
    while time.monotonic() < end:
        samples.append(one_way_ns())
        print(f"{samples[-1]:.0f}", end=" ", flush=True)
        time.sleep(args.every)
    print(f"\n{summary(samples)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
