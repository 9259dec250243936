"""Open-loop figures drawn serially vs on the render pool, in one run.

    python benchmarks/render.py                 # 64 figures; pools of 2 and 4 workers
    python benchmarks/render.py --figures 32 --json results/render.json

Prints the wall time of each way, the speed-up over serial, and whether every file is
byte-identical to the serial one. Pool start-up (spawning workers) is excluded, as in
the trainer, where the pool is created during set-up.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dreamer.evaluation.render import RenderPool
from dreamer.runtime.cores import usable_cores


def figures(count: int) -> list[dict]:
    """Arrays shaped like a DreamerV3 report: 16 steps of 64x64 frames, 5 of context."""
    rng = np.random.default_rng(0)
    return [
        dict(
            truth=rng.integers(0, 255, (16, 64, 64, 3), dtype=np.uint8),
            model=rng.integers(0, 255, (16, 64, 64, 3), dtype=np.uint8),
            context=5,
        )
        for _ in range(count)
    ]


def draw(jobs: list[dict], directory: Path, workers: int) -> tuple[float, dict[str, str]]:
    pool = RenderPool(workers)
    if workers:  # warm the workers up: spawning is set-up cost, not drawing
        pool.submit("bars", directory / "warmup.png", names=["x"], values=[1.0], title="")
        pool.collect(wait=True)
    started = time.perf_counter()
    for index, arguments in enumerate(jobs):
        pool.submit("open_loop", directory / f"open_loop_{index:03d}.png", **arguments)
    pool.close()
    seconds = time.perf_counter() - started
    if pool.failures:
        raise RuntimeError(pool.failures[0])
    hashes = {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.glob("open_loop_*.png"))
    }
    return seconds, hashes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--figures", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    jobs = figures(args.figures)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        serial_s, reference = draw(jobs, root / "serial", 0)
        pool_s, identical = {}, True
        for workers in args.workers:
            pool_s[str(workers)], hashes = draw(jobs, root / f"pool{workers}", workers)
            identical &= hashes == reference and len(hashes) == args.figures
    cores = usable_cores()
    print(f"{args.figures} open-loop figures, {cores} cores")
    print(f"serial: {serial_s:.1f} s")
    for workers, seconds in pool_s.items():
        speedup = serial_s / seconds
        goal = 0.85 * min(int(workers), cores)
        print(
            f"pool of {workers}: {seconds:.1f} s, speed-up {speedup:.2f}x "
            f"(goal {goal:.2f}x = 0.85 x min(workers, cores))"
        )
    print(f"byte-identical to serial: {identical}")
    if args.json:
        result = {"serial_s": serial_s, "pool_s": pool_s, "identical": identical}
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
