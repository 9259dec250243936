"""How long does the trainer keep its user waiting? ``--help``, a refused override's
one-line error, ``make smoke``'s run (``experiment=smoke``) from launch to its first
transitions and its first update, as the run's own "under way" line says (seconds since
the process started, its interpreter's start included), and a short smoke run from its
last line ("done: ...") to the end of its process. Each figure's minimum, median and
maximum over ``--repeat`` runs, one after another, on an idle machine.

    python benchmarks/start.py --repeat 3 --json benchmarks/results/start.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import UNTIL_STOPPED, cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRAIN = [sys.executable, "-m", "dreamer.train"]
UNDER_WAY = re.compile(r"first transitions ([\d.]+) s, first update ([\d.]+) s after launch")
# what issue 60 asks of a light start, in seconds
TARGETS = {"help": 1.0, "refused": 1.0, "first_transitions": 4.0, "first_update": 6.0}
SHORT = ["experiment=smoke", "run.steps=96", "eval.every=0", "run.progress=false"]


def wall(command: list[str], code: int) -> float:
    """Seconds ``command`` takes to its end, which must be ``code``."""
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - started
    assert done.returncode == code, done.stderr[-2000:]
    return seconds


def smoke_start() -> tuple[float, float]:
    """The smoke run's first transitions and first update, seconds after its launch."""
    with tempfile.TemporaryDirectory() as logdir:
        command = [*TRAIN, "experiment=smoke", UNTIL_STOPPED, f"run.logdir={logdir}"]
        run = subprocess.Popen(
            [*command, "run.progress=false"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            for line in run.stderr:
                if found := UNDER_WAY.search(line):
                    return float(found[1]), float(found[2])
            raise RuntimeError(f"the run ended (exit {run.wait()}) before its first update")
        finally:
            run.terminate()
            run.wait(120)


def smoke_end() -> float:
    """Seconds from a short smoke run's last line to the end of its process."""
    with tempfile.TemporaryDirectory() as logdir:
        run = subprocess.Popen(
            [*TRAIN, *SHORT, f"run.logdir={logdir}"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        done = None
        for line in run.stderr:
            if "INFO dreamer: done:" in line:
                done = time.perf_counter()
        code = run.wait(120)
        ended = time.perf_counter()
        assert code == 0 and done is not None, f"the short run ended with {code}"
        return ended - done


def spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {name: [] for name in [*TARGETS, "end"]}
    for _ in range(args.repeat):
        figures["help"].append(wall([*TRAIN, "--help"], 0))
        figures["refused"].append(wall([*TRAIN, "run.steps=-5"], 2))
        transitions, update = smoke_start()
        figures["first_transitions"].append(transitions)
        figures["first_update"].append(update)
        figures["end"].append(smoke_end())
    result = {
        "machine": cpu_model(),
        # torchrl imports mujoco and tensordict pandas where installed (~0.6 s of the
        # start): the dev extra has them (make test), make train's install does not
        "installed": [name for name in ("mujoco", "pandas") if importlib.util.find_spec(name)],
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", *sys.argv]),
        "commands": {
            "help": "python -m dreamer.train --help",
            "refused": "python -m dreamer.train run.steps=-5",
            "first_transitions": "python -m dreamer.train experiment=smoke: its under-way line",
            "first_update": "the same line",
            "end": f"python -m dreamer.train {' '.join(SHORT)}: its done line to its exit",
        },
        "seconds": {name: spread(values) for name, values in figures.items()},
        "targets_s": TARGETS,
    }
    print(f"with {', '.join(result['installed']) or 'neither mujoco nor pandas'} installed")
    for name, values in result["seconds"].items():
        target = f" (target {TARGETS[name]} s)" if name in TARGETS else ""
        print(f"{name:>18}: median {values['median']:.2f} s{target}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
