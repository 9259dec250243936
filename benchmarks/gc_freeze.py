"""What the frozen heap saves in the trainer's real loop (collector + replay + learner).

    python benchmarks/gc_freeze.py [--steps 3000] [--heap-objects 1000000] [--json PATH]

Runs ``python -m dreamer.train experiment=smoke`` (Crafter, ``model=tiny``) twice in
fresh processes, with ``run.gc_freeze=true`` and ``false``, after building
``--heap-objects`` extra long-lived objects, so the setup heap is as large as a real
run's (the imported libraries alone are ~0.4M objects; a MineDojo or large-replay
driver holds millions). Reads the GC counters the trainer logs (``gc/*``, from
``gc.callbacks``) and the loop's wall time (``time/wall_s``) from ``metrics.jsonl``.

``--json PATH`` writes gc_seconds_*, gen2_seconds_*, gc_share_frozen,
us_per_transition_* (loop wall time per env step received, in microseconds) for both.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_variant(freeze: bool, steps: int, heap_objects: int, logdir: Path) -> dict:
    """One training run in this process (called in a fresh subprocess)."""
    sys.path.insert(0, str(ROOT))
    from dreamer.train import main

    # lists are always GC-tracked (a dict of ints and strings would not be)
    ballast = [[i] for i in range(heap_objects)]  # noqa: F841
    full_collection = {}  # one forced full collection over this heap, frozen or not
    for frozen in (False, True):
        if frozen:
            gc.freeze()
        started = time.perf_counter()
        gc.collect()
        full_collection["frozen" if frozen else "unfrozen"] = time.perf_counter() - started
    gc.unfreeze()
    code = main(
        [
            "experiment=smoke",
            f"run.steps={steps}",
            "eval.every=0",
            f"run.gc_freeze={str(freeze).lower()}",
            f"run.logdir={logdir}",
            "run.progress=false",
        ]
    )
    assert code == 0, f"training exited {code}"
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]  # gc/* are running totals over the loop
    wall = sum(row["time/wall_s"] for row in rows)
    return {
        "frozen_objects": last["gc/frozen_objects"],
        "gc_seconds": last["gc/seconds"],
        "gen2_seconds": last["gc/gen2_seconds"],
        "collections": [last[f"gc/gen{g}_collections"] for g in range(3)],
        "loop_seconds": wall,
        "env_steps": last["env_steps"],
        "forced_full_collection_s": full_collection,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--heap-objects", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--variant", choices=["frozen", "unfrozen"], help=argparse.SUPPRESS)
    parser.add_argument("--logdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # the child: one run, its result as JSON on the last stdout line
        result = run_variant(args.variant == "frozen", args.steps, args.heap_objects, args.logdir)
        print(json.dumps(result))
        return 0
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for variant in ("frozen", "unfrozen"):
            command = [sys.executable, __file__, "--variant", variant, "--steps", str(args.steps)]
            command += ["--heap-objects", str(args.heap_objects)]
            command += ["--logdir", str(Path(scratch) / variant)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    frozen, unfrozen = results["frozen"], results["unfrozen"]
    summary = {
        "gc_seconds_frozen": frozen["gc_seconds"],
        "gc_seconds_unfrozen": unfrozen["gc_seconds"],
        "gen2_seconds_frozen": frozen["gen2_seconds"],
        "gen2_seconds_unfrozen": unfrozen["gen2_seconds"],
        "gc_share_frozen": frozen["gc_seconds"] / frozen["loop_seconds"],
        "gc_share_unfrozen": unfrozen["gc_seconds"] / unfrozen["loop_seconds"],
        "us_per_transition_frozen": 1e6 * frozen["loop_seconds"] / frozen["env_steps"],
        "us_per_transition_unfrozen": 1e6 * unfrozen["loop_seconds"] / unfrozen["env_steps"],
        "collections_frozen": frozen["collections"],
        "collections_unfrozen": unfrozen["collections"],
        "forced_full_collection_s": frozen["forced_full_collection_s"],
        "frozen_objects": frozen["frozen_objects"],
        "extra_heap_objects": args.heap_objects,
        "python": sys.version.split()[0],
    }
    print(
        f"setup heap: {frozen['frozen_objects']:,} objects frozen "
        f"({args.heap_objects:,} of them extra); {args.steps} Crafter steps, model=tiny"
    )
    print("| | frozen | unfrozen | ratio |")
    print("|---|---|---|---|")
    for label, key in (
        ("GC seconds", "gc_seconds"),
        ("full (gen 2) GC seconds", "gen2_seconds"),
        ("GC share of loop time", "gc_share"),
        ("loop us per transition", "us_per_transition"),
    ):
        a, b = summary[f"{key}_frozen"], summary[f"{key}_unfrozen"]
        ratio = f"{b / a:.1f}x" if a > 0 else "inf" if b > 0 else "-"
        print(f"| {label} | {a:.4g} | {b:.4g} | {ratio} |")
    print(f"| collections gen0/1/2 | {frozen['collections']} | {unfrozen['collections']} | |")
    forced = frozen["forced_full_collection_s"]
    print(
        f"one forced full collection over the setup heap before training: "
        f"{forced['unfrozen']:.3f} s unfrozen, {forced['frozen']:.4f} s frozen "
        f"({forced['unfrozen'] / max(forced['frozen'], 1e-9):.0f}x)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
