"""Are a run's evaluation reports drawn faster on the render pool than one after another,
and byte for byte the same? A real run's evaluation (``dreamer.evaluate``'s: the first
episode's video, the open-loop predictions, the learning curves, Crafter's achievement
bars) queued as the trainer queues them, ``--evals`` times over, then drawn serially and
on a pool of each size; the workers' start is set-up, not drawing (the trainer starts
them at its first evaluation). The design's figure: 880 s serially, 101 s on the pool
(8.7x) on a many-core node; a pool of n on c cores divides the time by min(n, c) at best.

    python benchmarks/render.py --json benchmarks/results/render.json
    python benchmarks/render.py --run runs/crafter/<ts>   # that run's checkpoint
    python benchmarks/render.py --quick                   # seconds: the suite runs it
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dreamer.evaluate import evaluate  # noqa: E402
from dreamer.evaluation.render import RenderPool  # noqa: E402
from dreamer.runtime.cores import usable_cores  # noqa: E402

DESIGN = {"serial_s": 880.0, "pool_s": 101.0}
TRAIN = ["experiment=smoke", "run.steps=600", "run.train_starts=200", "eval.every=0"]


class Queued:
    """A render pool that only keeps what is submitted to it: (kind, path, arguments)."""

    def __init__(self):
        self.jobs: list[tuple[str, Path, dict]] = []

    def submit(self, kind: str, path: Path, **arguments) -> None:
        self.jobs.append((kind, Path(path), arguments))


def train(logdir: Path) -> None:
    """A tiny Crafter run to take the reports of (a minute on two cores)."""
    command = [sys.executable, "-m", "dreamer.train", *TRAIN, "run.progress=false"]
    done = subprocess.run(
        [*command, f"run.logdir={logdir}"], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"the run to take reports of failed: {done.stderr[-3000:]}")


def drawn(jobs: list[tuple[str, Path, dict]], root: Path, folder: Path, workers: int):
    """Seconds to draw every job under ``folder`` on ``workers`` workers (0: serially),
    and each file's SHA-256 by its path there."""
    pool = RenderPool(workers)
    if workers:  # every worker up first: their start is the run's set-up, not drawing
        for index in range(workers):
            title = f"worker {index}"
            pool.submit(
                "bars",
                folder.parent / f"warm{workers}-{index}.png",
                names=["x"],
                values=[1.0],
                title=title,
            )
        pool.collect(wait=True)
    started = time.perf_counter()
    for kind, path, arguments in jobs:
        pool.submit(kind, folder / path.relative_to(root), **arguments)
    pool.close()
    seconds = time.perf_counter() - started
    if pool.failures:
        raise RuntimeError(pool.failures[0])
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return seconds, {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a run directory (default: train a tiny one)")
    parser.add_argument("--evals", type=int, default=8, help="evaluations' reports to draw")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--quick", action="store_true", help="1 evaluation, a pool of 2")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.evals, args.workers = 1, [2]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        logdir = args.run or scratch / "run"
        if args.run is None:
            train(logdir)
        queued = Queued()
        # its processes (and the pools below) fork from a forkserver, as a run's do
        max_steps = 30 if args.quick else 200
        evaluate(
            logdir, reports=True, pool=queued, serve_forks=True, episodes=1, max_steps=max_steps
        )
        one = queued.jobs  # one evaluation's reports, as many times as asked
        jobs = [
            (kind, logdir / f"eval{i}" / path.relative_to(logdir), arguments)
            for i in range(args.evals)
            for kind, path, arguments in one
        ]
        serial_s, reference = drawn(jobs, logdir, scratch / "serial", 0)
        pool_s, identical = {}, {}
        for workers in args.workers:
            seconds, files = drawn(jobs, logdir, scratch / f"pool{workers}", workers)
            pool_s[str(workers)], identical[str(workers)] = seconds, files == reference
    cores = usable_cores()
    kinds = sorted({kind for kind, _, _ in one})
    print(
        f"{len(jobs)} report files ({', '.join(kinds)}) of {args.evals} evaluations; {cores} cores"
    )
    design = DESIGN["serial_s"] / DESIGN["pool_s"]
    print(f"  serially {serial_s:.2f} s")
    for workers, seconds in pool_s.items():
        best = min(int(workers), cores)
        print(
            f"  a pool of {workers}: {seconds:.2f} s, {serial_s / seconds:.2f}x (at best {best}x "
            f"here: {cores} cores); byte-identical: {identical[workers]}"
        )
    print(
        f"  design: {DESIGN['serial_s']:.0f} s -> {DESIGN['pool_s']:.0f} s ({design:.1f}x) on a "
        f"many-core node; {cores} cores cannot show it: a pool divides by min(workers, cores)"
    )
    if args.json:
        result = {
            "machine": cpu_model(),
            "cores": cores,
            "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(["python", "benchmarks/render.py", *(argv or sys.argv[1:])]),
            "files": len(jobs),
            "kinds": kinds,
            "serial_s": serial_s,
            "pool_s": pool_s,
            "identical": identical,
            "design_s": DESIGN,
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(identical.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
