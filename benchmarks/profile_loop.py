"""The update inside a real run against the same update alone, operator kind by kind.

    python benchmarks/profile_loop.py [--steps 3000] [--updates 8] [--json FILE]

Trains ``experiment=dmc_proprio_cpu env.task=cartpole_balance`` (16 env workers, paced
collection, size1m, compiled fused update) in this process with the trainer's own
``main``; past ``--after`` updates, each of the next ``--updates`` updates runs under
torch's profiler with ``benchmarks/profile_update.py``'s phase labels (the first one's
profile is dropped: compiled graphs recompile once under the profiler). Then the same
learner alone (``profile_update.py``'s, on a synthetic batch) at the run's learner
threads. Prints the two tables side by side: where the loop's extra time per update
sits (a phase, an operator kind, or outside the operators: waits between them).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE / "peers")]

# first: dreamer.train sets libgomp's spin before torch loads, as in a user's run
from dreamer import train  # noqa: E402, I001

import argparse  # noqa: E402
import collections  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import profile_update  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from update_ours import Ours  # noqa: E402

from dreamer.learning.learner import Learner  # noqa: E402

PRESET = ["experiment=dmc_proprio_cpu", "env.task=cartpole_balance"]
GAP = 0.05  # s between two updates beyond which collection ran between them


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class LoopProfile:
    """Wraps ``Learner.update``: updates ``after`` .. ``after + count`` profiled one by
    one, their operator times summed."""

    def __init__(self, after: int, count: int):
        self.after, self.count = after, count
        self.seen = 0
        self.walls: list[float] = []
        self.unprofiled: list[tuple[float | None, float]] = []  # (gap before it, its wall)
        self.last_end: float | None = None
        self.events: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
        self.original = Learner.update

    def install(self) -> None:
        profiler = self

        @functools.wraps(self.original)
        def update(learner, batch):
            profiler.seen += 1
            if profiler.seen == 1:
                for name, (path, method) in profile_update.PHASES.items():
                    target = functools.reduce(getattr, path.split("."), learner)
                    profile_update.label(target, method, name)
            if not profiler.after < profiler.seen <= profiler.after + profiler.count + 1:
                started = time.perf_counter()
                result = profiler.original(learner, batch)
                ended = time.perf_counter()
                gap = started - profiler.last_end if profiler.last_end else None
                profiler.unprofiled.append((gap, ended - started))
                profiler.last_end = ended
                return result
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                started = time.perf_counter()
                result = profiler.original(learner, batch)
                wall = time.perf_counter() - started
            if profiler.seen > profiler.after + 1:  # the first recompiles under the profiler
                profiler.walls.append(wall)
                for event in prof.key_averages():
                    total = profiler.events[event.key]
                    total[0] += (
                        event.self_cpu_time_total
                        if not event.key.startswith("phase: ")
                        else event.cpu_time_total
                    )
                    total[1] += event.count
            return result

        Learner.update = update

    def result(self) -> dict:
        n = len(self.walls)
        phases = {
            key.removeprefix("phase: "): ms / 1e3 / n
            for key, (ms, _) in self.events.items()
            if key.startswith("phase: ")
        }
        total = sum(us for key, (us, _) in self.events.items() if not key.startswith("phase: "))
        total = total / 1e3 / n
        phases["backward"] = total - phases["forward"] - phases["optimizer"]
        kinds: dict[str, dict] = collections.defaultdict(lambda: {"ms": 0.0, "calls": 0})
        for key, (us, count) in self.events.items():
            if key.startswith("phase: "):
                continue
            entry = kinds[profile_update.kind(key)]
            entry["ms"] += us / 1e3 / n
            entry["calls"] += count // n
        steady = self.unprofiled[self.after :]  # past the profiled ones (and compiling)
        after_collection = [wall for gap, wall in steady if gap is not None and gap > GAP]
        within_burst = [wall for gap, wall in steady if gap is not None and gap <= GAP]
        return {
            "unprofiled_s_first_of_burst": mean(after_collection),
            "unprofiled_s_within_burst": mean(within_burst),
            "unprofiled_updates": [len(after_collection), len(within_burst)],
            "profiled_ms_per_update": total,
            "wall_s_per_update_profiled": self.walls,
            "phases_ms": phases,
            "kinds": dict(kinds),
        }


def side_by_side(loop: dict, alone: dict) -> str:
    lines = ["| | in the run (ms) | alone (ms) | run / alone |", "|---|---|---|---|"]
    wall_loop = 1e3 * min(loop["wall_s_per_update_profiled"])
    wall_alone = 1e3 * min(alone["wall_s_per_update_profiled"])
    rows = [("wall per update (best)", wall_loop, wall_alone)]
    rows.append(
        ("operators' own time", loop["profiled_ms_per_update"], alone["profiled_ms_per_update"])
    )
    rows += [
        (f"phase: {k}", v, alone["phases_ms"].get(k, 0.0)) for k, v in loop["phases_ms"].items()
    ]
    names = sorted(
        set(loop["kinds"]) | set(alone["kinds"]),
        key=lambda k: -loop["kinds"].get(k, {"ms": 0})["ms"],
    )
    for name in names:
        ours, theirs = loop["kinds"].get(name, {"ms": 0.0}), alone["kinds"].get(name, {"ms": 0.0})
        rows.append((f"operators: {name}", ours["ms"], theirs["ms"]))
    for label, a, b in rows:
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | {a / b if b else float('nan'):.2f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000, help="env steps of the run")
    parser.add_argument("--after", type=int, default=40, help="updates before profiling")
    parser.add_argument("--updates", type=int, default=8, help="profiled updates")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    hook = LoopProfile(args.after, args.updates)
    hook.install()
    logdir = Path(tempfile.mkdtemp(prefix="profile-loop-")) / "run"
    overrides = [*PRESET, f"run.steps={args.steps}", "eval.every=0", "run.progress=false"]
    code = train.main([*overrides, f"run.logdir={logdir}"])
    if code != 0 or len(hook.walls) < args.updates:
        raise SystemExit(f"profile_loop: the run ended with {code} after {hook.seen} updates")
    loop = hook.result()
    threads = torch.get_num_threads()
    Learner.update = hook.original
    ours = Ours()
    ours.build("vector", threads, "compiled", True, 16, 64)
    for _ in range(3):
        ours.update()
    alone = profile_update.profile_updates(ours, args.updates)
    print(side_by_side(loop, alone))
    print(
        f"unprofiled updates in the run: first of a burst {loop['unprofiled_s_first_of_burst']}"
        f" s, within a burst {loop['unprofiled_s_within_burst']} s"
        f" ({loop['unprofiled_updates']} updates)"
    )
    result = {
        "loop": loop,
        "alone": alone,
        "threads": threads,
        "load_average": [load_before, os.getloadavg()],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/profile_loop.py " + " ".join(argv),
        "torch": torch.__version__,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
