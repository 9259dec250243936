"""The trainer's thread layout on this machine's cores: end-to-end updates/s and env
steps/s of one preset under each layout, one layout after the other.

    python benchmarks/threads.py                       # every layout, dmc_proprio_cpu
    python benchmarks/threads.py --layouts default learner1 --steps 6000

Each layout trains ``experiment=dmc_proprio_cpu env.task=cartpole_balance`` from
scratch to ``--steps`` env steps in a fresh run directory (the compile cache warm from
a first untimed run) and is judged on its metrics rows past the first ``--skip`` env
steps after updates started (compilation and the first updates excluded): updates/s =
updates / wall seconds and env steps/s likewise, summed over those rows. A layout is
a set of overrides and environment variables (``LAYOUTS``). Prints a table and writes
``--json`` (default ``benchmarks/results/threads_<preset>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.runs import jsonl_rows  # noqa: E402

PRESET = ["experiment=dmc_proprio_cpu", "env.task=cartpole_balance"]
# name: (overrides, environment variables)
LAYOUTS = {
    "default": ([], {}),
    "unpaced": (["collector.pace=none"], {}),  # the default before collector.pace
    "nice": (["collector.pace=nice"], {}),
    "pause": (["collector.pace=pause"], {}),
    "nice_learner1": (["collector.pace=nice", "learner.threads=1"], {}),
    "learner1": (["learner.threads=1"], {}),
    "learner2": (["learner.threads=2"], {}),
    "learner2_passive": (["learner.threads=2"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "learner1_inference2": (["learner.threads=1", "collector.threads=2"], {}),
}


def measure(rows: list[dict], skip: int) -> dict:
    started = next((row["env_steps"] for row in rows if row.get("updates", 0) > 0), None)
    if started is None:
        return {"error": "no update"}
    timed = [row for row in rows if row["env_steps"] > started + skip and "time/wall_s" in row]
    wall = sum(row["time/wall_s"] for row in timed)
    if not timed or wall <= 0:
        return {"error": "no timed rows"}
    first = rows[rows.index(timed[0]) - 1]
    updates = timed[-1]["updates"] - first["updates"]
    env_steps = timed[-1]["env_steps"] - first["env_steps"]
    update_s = sum(row.get("time/update_s", 0.0) for row in timed)
    return {
        "updates_per_s": updates / wall,
        "env_steps_per_s": env_steps / wall,
        "update_share": update_s / wall,
        "s_per_update": update_s / max(updates, 1),
        "timed_wall_s": wall,
        "timed_rows": len(timed),
    }


def run(name: str, steps: int, skip: int, workdir: Path, overrides: list[str]) -> dict:
    extra, env = LAYOUTS[name]
    logdir = workdir / name
    command = [sys.executable, "-m", "dreamer.train", *PRESET, *extra, *overrides]
    command += [f"run.steps={steps}", "eval.every=0", "run.progress=false", f"run.logdir={logdir}"]
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True
    )
    result = {"overrides": extra, "env": env, "wall_s": round(time.monotonic() - started, 1)}
    if done.returncode != 0:
        return result | {"error": done.stderr.strip().splitlines()[-1:]}
    return result | measure(jsonl_rows(logdir / "metrics.jsonl"), skip)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--steps", type=int, default=8000, help="env steps per layout")
    parser.add_argument("--skip", type=int, default=2000, help="env steps not timed")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*", help="more overrides for every layout")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="threads-"))
    print("warming the compile cache (untimed)", flush=True)
    run("default", 2000, 0, workdir / "warm", args.overrides)
    results = {}
    for name in args.layouts:
        results[name] = run(name, args.steps, args.skip, workdir, args.overrides)
        print(name, json.dumps(results[name]), flush=True)
    print("\n| layout | updates/s | env steps/s | update share of wall | s/update |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | |")
            continue
        print(
            f"| {name} | {r['updates_per_s']:.3f} | {r['env_steps_per_s']:.1f} | "
            f"{r['update_share']:.0%} | {r['s_per_update']:.2f} |"
        )
    path = args.json or ROOT / "benchmarks" / "results" / "threads_dmc_proprio_cpu.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "preset": PRESET,
        "steps": args.steps,
        "skip": args.skip,
        "machine": {
            "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "load_average_end": os.getloadavg(),
        },
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "layouts": results,
    }
    path.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
