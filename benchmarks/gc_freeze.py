"""How long does Python's garbage collector pause the driver's loop, with the set-up heap
frozen (``gc.freeze()``, ``run.gc_freeze=true``, the default) and without? The same real
run twice, one way each; from its metrics: the pause of a full collection as the loop
began (``gc/full_collection_s``) and every generation-2 collection the loop had. The
design's figure: a full collection's pause 0.208 s -> 0.025 s (8.3x).

    python benchmarks/gc_freeze.py --json benchmarks/results/gc_freeze.json
    python benchmarks/gc_freeze.py --quick     # a short run each way: seconds, the suite's
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import cpu_model, jsonl_rows  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DESIGN = {"unfrozen": 0.208, "frozen": 0.025}  # a full collection's pause, seconds
RUN = ["experiment=smoke", "run.progress=false"]  # 2,000 Crafter steps, evaluations
QUICK = ["run.steps=300", "run.train_starts=200", "eval.every=0"]


def train(arguments: list[str]) -> subprocess.CompletedProcess:
    """``python -m dreamer.train arguments``, to its end, its output captured."""
    command = [sys.executable, "-m", "dreamer.train", *arguments]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600)


def run(frozen: bool, overrides: list[str], launch=train) -> dict:
    """One real run (``launch``: how a trainer runs, the tests' forks it from their zygote);
    its last metrics row's gc figures."""
    with tempfile.TemporaryDirectory() as logdir:
        done = launch(
            [*RUN, *overrides, f"run.gc_freeze={str(frozen).lower()}", f"run.logdir={logdir}"]
        )
        if done.returncode:
            raise RuntimeError(f"exit {done.returncode}: {done.stderr[-3000:]}")
        row = [r for r in jsonl_rows(Path(logdir) / "metrics.jsonl") if "gc/seconds" in r][-1]
    gen2 = row["gc/gen2_collections"]
    return {
        "full_collection_s": row["gc/full_collection_s"],
        "frozen_objects": row["gc/frozen_objects"],
        "gen2_collections": gen2,
        "gen2_mean_s": row["gc/gen2_seconds"] / gen2 if gen2 else None,
        "gen2_longest_s": row["gc/gen2_longest_s"],
        "gc_seconds": row["gc/seconds"],
        "env_steps": row["env_steps"],
    }


def main(argv: list[str] | None = None, launch=train) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 300-step run each way")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*", help="the runs' config overrides")
    args = parser.parse_args(argv)
    overrides = (QUICK if args.quick else []) + args.overrides
    ways = {name: run(name == "frozen", overrides, launch) for name in ("unfrozen", "frozen")}
    unfrozen, frozen = (ways[name]["full_collection_s"] for name in ("unfrozen", "frozen"))
    ratio = unfrozen / frozen if frozen else float("inf")
    design = DESIGN["unfrozen"] / DESIGN["frozen"]
    print(f"{ways['frozen']['frozen_objects']:,} objects frozen; a full collection's pause:")
    print(f"  unfrozen {unfrozen:.4f} s, frozen {frozen:.6f} s: {ratio:,.0f}x", end="")
    print(f" (design: {DESIGN['unfrozen']} s -> {DESIGN['frozen']} s, {design:.1f}x)")
    for name, way in ways.items():
        mean, longest = way["gen2_mean_s"], way["gen2_longest_s"]
        each = f", {mean:.4f} s on average, the longest {longest:.4f} s" if mean is not None else ""
        print(f"  {name}: {way['gen2_collections']} generation-2 collections in the loop{each}")
    if args.json:
        result = {
            "machine": cpu_model(),
            "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(["python", "benchmarks/gc_freeze.py", *(argv or sys.argv[1:])]),
            "runs": ways,
            "full_collection_ratio": ratio,
            "design_s": DESIGN,
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
