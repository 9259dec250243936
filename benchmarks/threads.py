"""The trainer's thread layout on this machine's cores: end-to-end updates/s and env
steps/s of one preset under each layout, one layout after the other.

    python benchmarks/threads.py                       # every layout, dmc_proprio_cpu
    python benchmarks/threads.py --layouts default learner1 --steps 6000

Each layout trains ``experiment=dmc_proprio_cpu env.task=cartpole_balance`` from
scratch to ``--steps`` env steps in a fresh run directory (the compile cache warm from
a first untimed run) and is judged on its metrics rows past the first ``--skip`` env
steps after updates started (compilation and the first updates excluded): updates/s =
updates / wall seconds and env steps/s likewise, summed over those rows. A layout is
a set of overrides and environment variables (``LAYOUTS``).

Per layout it also records the loop's wall seconds per update (``loop_s_per_update``)
beside the update's own (``s_per_update``), the learner's torch threads (from the
run's start-up line), and, sampled every ``--sample`` seconds over the whole run, the
peak PSS of the run's process tree (``/proc/<pid>/smaps_rollup``: a page shared by n
processes counts 1/n in each, so shared pages count once) and its peak process count,
and the CPU time the hypervisor stole from the VM meanwhile (``steal_s``).
``--alone`` adds the isolated update of the same model and learner, ``benchmarks/learner.py
--obs vector --model size1m --modes compiled experiment=dmc_proprio_cpu`` at 1 and 2
threads, run after the layouts: "the run" table in
benchmarks/README.md compares the loop's seconds per update with the best of them.
``--repeat N`` runs N rounds of every layout (and the update alone), interleaved so that
the machine's drift reaches each alike; the table then gives each figure's median over
the rounds and ``loop / best alone`` per round.

Most of that drift is the host's placement of the VM's two cores (benchmarks/placement.py:
on one core complex or on two, flipping every few seconds to minutes), which moves a
two-thread update by ~25%. So the loop's timed window is probed every second, the update
alone before and after each of its 16 timed updates (``benchmarks/learner.py
--placement``), and the last column compares, per placement, the loop (each update's
start and end from ``benchmarks/train_timed.py``; the loop's seconds per update are
the spans from one update's start to the next's that the probe saw wholly in that
placement) with the update alone there (the one-thread update, which has no partner to
wait for, counts in either).
Prints a table and writes ``--json`` (default ``benchmarks/results/the_run_dmc_proprio_cpu.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.placement import PlacementSampler, summary, where  # noqa: E402
from tests.runs import descendants, jsonl_rows  # noqa: E402

PRESET = ["experiment=dmc_proprio_cpu", "env.task=cartpole_balance"]
# name: (overrides, environment variables)
LAYOUTS = {
    "default": ([], {}),
    "unpaced": (["collector.pace=none"], {}),  # the default before collector.pace
    "nice": (["collector.pace=nice"], {}),
    "pause": (["collector.pace=pause"], {}),
    "stop": (["collector.pace=stop"], {}),
    "nice_learner1": (["collector.pace=nice", "learner.threads=1"], {}),
    "learner1": (["learner.threads=1"], {}),
    "learner2": (["learner.threads=2"], {}),
    "learner2_passive": (["learner.threads=2"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    # libgomp's spin before a waiting thread sleeps (the trainer's: 1,000 iterations;
    # 300,000 is libgomp's own default)
    **{
        f"spin{count}": ([], {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": str(count)})
        for count in (100, 3000, 30000, 300000)
    },
    "learner1_inference2": (["learner.threads=1", "collector.threads=2"], {}),
    # the 16 envs in 4 processes / 1 (torchrl serves their policy from a driver thread)
    "grouped4": (["collector.envs_per_worker=4"], {}),
    "grouped16": (["collector.envs_per_worker=16"], {}),
}


def timed_rows(rows: list[dict], skip: int) -> list[dict]:
    """The row that opens the timed window, then the timed rows: those past the first
    ``skip`` env steps after updates began (compiling and the first updates excluded);
    empty if there are none."""
    started = next((row["env_steps"] for row in rows if row.get("updates", 0) > 0), None)
    if started is None:
        return []
    timed = [row for row in rows if row["env_steps"] > started + skip and "time/wall_s" in row]
    return [rows[rows.index(timed[0]) - 1], *timed] if timed else []


def measure(rows: list[dict], skip: int) -> dict:
    if not any(row.get("updates", 0) > 0 for row in rows):
        return {"error": "no update"}
    first, *timed = timed_rows(rows, skip) or [None]
    wall = sum(row["time/wall_s"] for row in timed)
    if not timed or wall <= 0:
        return {"error": "no timed rows"}
    updates = timed[-1]["updates"] - first["updates"]
    env_steps = timed[-1]["env_steps"] - first["env_steps"]
    update_s = sum(row.get("time/update_s", 0.0) for row in timed)
    return {
        "updates_per_s": updates / wall,
        "env_steps_per_s": env_steps / wall,
        "update_share": update_s / wall,
        "s_per_update": update_s / max(updates, 1),
        "loop_s_per_update": wall / max(updates, 1),
        "timed_wall_s": wall,
        "timed_rows": len(timed),
    }


def span_place(begun: float, ended: float, samples: list[tuple[float, float]]) -> str:
    """A span's placement (``placement.where``) from the probes around it (``samples``:
    Unix time, ns, in time order); mixed without a probe on either side."""
    before = [ns for at, ns in samples if at <= begun][-1:]
    inside = [ns for at, ns in samples if begun < at < ended]
    after = [ns for at, ns in samples if at >= ended][:1]
    return where(*before, *inside, *after) if before and after else "mixed"


def updates_by_placement(
    updates: list[tuple[float, float]], window: tuple[float, float], samples
) -> dict:
    """Per placement, over the timed ``window``: the update's own seconds (the median
    of the updates the probes saw there) and the loop's seconds per update (the mean
    span from one update's start to the next's, collection included when it fell
    between them); ``updates``: (start, end) each."""
    timed = [(a, b) for a, b in updates if window[0] <= a and b <= window[1]]
    own = {"near": [], "far": [], "mixed": []}
    loop = {"near": [], "far": [], "mixed": []}
    for (begun, ended), (following, _) in zip(timed, timed[1:] + [(None, None)]):
        own[span_place(begun, ended, samples)].append(ended - begun)
        if following is not None:
            loop[span_place(begun, following, samples)].append(following - begun)
    return {
        place: {
            "updates": len(own[place]),
            "s_per_update": statistics.median(own[place]) if own[place] else None,
            "loop_spans": len(loop[place]),
            "loop_s_per_update": statistics.mean(loop[place]) if loop[place] else None,
        }
        for place in ("near", "far")
    }


def steal_seconds() -> float:
    """CPU time the hypervisor gave to others while this VM's vCPUs wanted it, summed
    over the vCPUs since boot (``/proc/stat``'s steal column)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def pss_bytes(pid: int) -> int:
    """The proportional set size of one process (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    found = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    return int(found[1]) * 1024 if found else 0


class TreeSampler(threading.Thread):
    """The peak PSS and the peak process count of ``pid``'s process tree."""

    def __init__(self, pid: int, every: float):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak_pss = self.peak_processes = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            tree = [self.pid, *descendants(self.pid)]
            self.peak_pss = max(self.peak_pss, sum(map(pss_bytes, tree)))
            self.peak_processes = max(self.peak_processes, len(tree))


def run(
    name: str, steps: int, skip: int, workdir: Path, overrides: list[str], sample: float = 1.0
) -> dict:
    extra, env = LAYOUTS[name]
    logdir = workdir / name
    timeline = workdir / f"{name}.updates"
    command = [sys.executable, "benchmarks/train_timed.py", str(timeline), *PRESET]
    command += [*extra, *overrides]
    command += [f"run.steps={steps}", "eval.every=0", "run.progress=false", f"run.logdir={logdir}"]
    started, stolen = time.monotonic(), steal_seconds()
    log = workdir / f"{name}.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=stderr
        )
        sampler, placement = TreeSampler(process.pid, sample), PlacementSampler()
        sampler.start()
        placement.start()
        process.wait()
        sampler.done.set()
        sampler.join()
        placement.stop()
    text = log.read_text()
    threads = re.search(r"learner: (\d+) torch threads", text)
    pace = re.search(r"collection pace while it updates: (\w+)", text)
    result = {
        "overrides": extra,
        "env": env,
        "wall_s": round(time.monotonic() - started, 1),
        "steal_s": round(steal_seconds() - stolen, 2),
        "learner_threads": int(threads[1]) if threads else None,
        "pace": pace[1] if pace else None,
        "peak_pss_bytes": sampler.peak_pss,
        "peak_processes": sampler.peak_processes,
    }
    if process.returncode != 0:
        return result | {"error": text.strip().splitlines()[-1:]}
    rows = jsonl_rows(logdir / "metrics.jsonl")
    result |= measure(rows, skip)
    # the timed window in Unix time: its rows' timestamps, the probes' and updates' clock
    bounds = [row["timestamp"] for row in timed_rows(rows, skip)] or [0.0]
    window = (bounds[0], bounds[-1])
    probed = [(at, ns) for at, ns in placement.samples if window[0] <= at <= window[1]]
    updates = [tuple(map(float, line.split())) for line in timeline.read_text().splitlines()]
    return result | {
        "placement": summary([ns for _, ns in probed]),
        "updates_by_placement": updates_by_placement(updates, window, placement.samples),
    }


def alone(threads: int, workdir: Path) -> tuple[float | None, dict | None]:
    """Seconds per compiled size1m vector update, the update alone on ``threads`` (the
    median of 16), and the median per placement of the cores (``--placement``)."""
    path = workdir / f"alone{threads}.json"
    command = [sys.executable, "benchmarks/learner.py", "--obs", "vector", "--model", "size1m"]
    command += ["--modes", "compiled", "--updates", "16", "--placement", "--json", str(path)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([*command, PRESET[0]], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not path.exists():
        print(done.stderr[-2000:], file=sys.stderr)
        return None, None
    compiled = json.loads(path.read_text())["modes"]["compiled"]
    return 1 / compiled["updates_per_s"], compiled.get("placement")


def merged(runs: list[dict]) -> dict:
    """One layout's rounds: each figure's median (a failed round: its error)."""
    if failed := [r for r in runs if "error" in r]:
        return failed[0]
    result = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            result[key] = statistics.median(r[key] for r in runs)
    return result


def loop_over_alone(one_round: dict, name: str) -> float | None:
    """A round's loop seconds per update over the best update alone of that round."""
    layout, isolated = one_round["layouts"][name], one_round["alone_s_per_update"]
    best = min((s for s in isolated.values() if s), default=None)
    return layout["loop_s_per_update"] / best if best and "error" not in layout else None


def placed_ratio(one_round: dict, name: str) -> str:
    """Per placement of the cores (benchmarks/placement.py): a round's loop seconds per
    update over the spans the probes saw wholly there, against the best update alone
    there (the one-thread update, which has no partner to wait for, counts in either):
    the two-thread update alone differs by ~25% between them."""
    layout = one_round["layouts"][name]
    if "error" in layout or not layout.get("updates_by_placement"):
        return "-"
    found = []
    for place, there in layout["updates_by_placement"].items():
        if not there["loop_spans"]:
            continue
        placed = (one_round.get("alone_placement", {}).get(2) or {}).get(place, {}).get("s")
        alone = [s for s in (placed, one_round["alone_s_per_update"].get(1)) if s]
        ratio = f"{there['loop_s_per_update'] / min(alone):.2f}" if placed else "none alone"
        found.append(f"{place} {ratio} ({there['loop_spans']} updates)")
    return "; ".join(found) or "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--steps", type=int, default=8000, help="env steps per layout")
    parser.add_argument("--skip", type=int, default=2000, help="env steps not timed")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--sample", type=float, default=1.0, help="seconds between PSS samples")
    parser.add_argument(
        "--alone", action="store_true", help="also the update alone, 1 and 2 threads"
    )
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds")
    parser.add_argument("overrides", nargs="*", help="more overrides for every layout")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="threads-"))
    (workdir / "warm").mkdir()
    print("warming the compile cache (untimed)", flush=True)
    run("default", 2000, 0, workdir / "warm", args.overrides)
    rounds = []
    for index in range(args.repeat):
        here = workdir / f"round{index}"
        here.mkdir()
        layouts = {}
        for name in args.layouts:
            layouts[name] = run(name, args.steps, args.skip, here, args.overrides, args.sample)
            print(index, name, json.dumps(layouts[name]), flush=True)
        measured = {n: alone(n, here) for n in (1, 2)} if args.alone else {}
        isolated = {n: seconds for n, (seconds, _) in measured.items()}
        placements = {n: placed for n, (_, placed) in measured.items()}
        print(f"{index} the update alone (s): {isolated} {placements}" if isolated else "")
        rounds.append(
            {"layouts": layouts, "alone_s_per_update": isolated, "alone_placement": placements}
        )
    results = {name: merged([r["layouts"][name] for r in rounds]) for name in args.layouts}
    columns = ["layout", "pace", "learner threads", "s/update in the loop", "update's own"]
    columns += ["loop / best alone (per round)", "the same in the loop's placement (per round)"]
    columns += ["peak PSS GB", "processes", "env steps/s"]
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | failed: {r['error']} |" + " |" * (len(columns) - 2))
            continue
        ratios = [loop_over_alone(one, name) for one in rounds]
        ratio = ", ".join(f"{x:.2f}" for x in ratios if x) or "-"
        far = ", ".join(placed_ratio(one, name) for one in rounds)
        print(
            f"| {name} | {r['pace']} | {r['learner_threads']} | {r['loop_s_per_update']:.3f} | "
            f"{r['s_per_update']:.3f} | {ratio} | {far} | {r['peak_pss_bytes'] / 1e9:.2f} | "
            f"{r['peak_processes']} | {r['env_steps_per_s']:.1f} |"
        )
    path = args.json or ROOT / "benchmarks" / "results" / "the_run_dmc_proprio_cpu.json"
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
        "alone_s_per_update": {
            str(n): statistics.median(r["alone_s_per_update"][n] for r in rounds)
            for n in (1, 2)
            if args.alone and all(r["alone_s_per_update"][n] for r in rounds)
        },
        "rounds": rounds,
    }
    path.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
