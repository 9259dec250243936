"""Where one update of ours goes: the phases of the loss and the kinds of operator.

    python benchmarks/profile_update.py [--obs vector] [--mode compiled] [--threads 1]
        [--json benchmarks/results/profile_update.json]

The learner is ``benchmarks/peers/update_ours.py``'s (``experiment=dmc_proprio``,
size1m, batch 16 x 64, imagination of 15 steps from all 1,024 states, the loss's scans) on
a synthetic batch. After warm-ups, ``--updates`` updates run under torch's profiler with
each phase labelled (the loss's methods and the optimizer step, wrapped here, not
in the package); backward is what the update spends outside the forward and the
optimizer. Operators are grouped by what bounds them: matrix products (with the FLOPs
of ``benchmarks/flop_count.py`` and their achieved rate beside this CPU's matmul roof),
compiled kernels (inductor's fused elementwise code), copies, and every other eager
operator. The per-call overhead shows as many small calls of the last group.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(0, str(HERE))

from matmul_roof import roof  # noqa: E402
from update_ours import Ours  # noqa: E402

PHASES = {  # label: (attribute path from the learner, method)
    "forward": ("stepper.loss_module", "forward"),
    "world model": ("stepper.loss_module", "_world_model"),
    "posterior rollout (64 steps)": ("stepper.loss_module.cell", "observe"),
    "imagination (15 steps)": ("stepper.loss_module", "_imagine"),
    "heads, actor and critic losses on imagined states": ("stepper.loss_module", "_behavior"),
    "optimizer": ("optimizer", "step"),
}
KINDS = {
    "matmul": {"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm"},
    "copy": {"aten::copy_", "aten::cat", "aten::stack", "aten::clone"},
}


def kind(name: str) -> str:
    for label, names in KINDS.items():
        if name in names:
            return label
    if name.startswith("## Call CompiledFxGraph"):
        return "compiled kernels"
    if name.startswith("aten::"):
        return "other eager ops"
    return "framework"  # autograd nodes, dynamo guards, profiler labels


def label(obj, method: str, name: str) -> None:
    """Wrap ``obj.method`` so its calls show in the profile as ``name``."""
    original = getattr(obj, method)

    @functools.wraps(original)
    def labelled(*args, **kwargs):
        with record_function(f"phase: {name}"):
            return original(*args, **kwargs)

    setattr(obj, method, labelled)


def profile_updates(ours: Ours, updates: int) -> dict:
    learner = ours.learner
    for name, (path, method) in PHASES.items():
        label(functools.reduce(getattr, path.split("."), learner), method, name)
    with profile(activities=[ProfilerActivity.CPU]):
        ours.update()  # compiled graphs guard on the profiler: their recompile goes here
    walls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(updates):
            started = time.perf_counter()
            ours.update()
            walls.append(time.perf_counter() - started)
    events = prof.key_averages()
    phases = {
        e.key.removeprefix("phase: "): e.cpu_time_total / 1e3 / updates
        for e in events
        if e.key.startswith("phase: ")
    }
    total = sum(e.self_cpu_time_total for e in events) / 1e3 / updates
    phases["backward"] = total - phases["forward"] - phases["optimizer"]
    kinds: dict[str, dict] = collections.defaultdict(lambda: {"ms": 0.0, "calls": 0})
    for e in events:
        entry = kinds[kind(e.key)]
        entry["ms"] += e.self_cpu_time_total / 1e3 / updates
        entry["calls"] += e.count // updates
    return {
        "profiled_ms_per_update": total,
        "wall_s_per_update_profiled": walls,
        "phases_ms": phases,
        "kinds": dict(kinds),
    }


def table(result: dict) -> str:
    total = result["profiled_ms_per_update"]
    lines = ["| phase | ms / update | share |", "|---|---|---|"]
    for name, ms in result["phases_ms"].items():
        lines.append(f"| {name} | {ms:.0f} | {ms / total:.0%} |")
    lines += ["", "| operators | ms / update | share | calls / update |", "|---|---|---|---|"]
    for name, entry in sorted(result["kinds"].items(), key=lambda kv: -kv[1]["ms"]):
        ms, calls = entry["ms"], entry["calls"]
        lines.append(f"| {name} | {ms:.0f} | {ms / total:.0%} | {calls} |")
    matmul = result["matmul"]
    lines.append(
        f"\nmatrix products: {matmul['gflop']:.1f} GFLOP per update at "
        f"{matmul['gflops_per_s']:.0f} GFLOP/s "
        f"(this CPU's fp32 roof: {matmul['roof_gflops_per_s']:.0f})"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--obs", choices=("vector", "image"), default="vector")
    parser.add_argument("--mode", choices=("eager", "compiled"), default="compiled")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--updates", type=int, default=3, help="profiled updates")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    ours = Ours()
    ours.build(args.obs, args.threads, args.mode, True, 16, 64)
    for _ in range(args.warmup):
        ours.update()
    timed = []
    for _ in range(args.updates):
        started = time.perf_counter()
        ours.update()
        timed.append(time.perf_counter() - started)
    flops = ours.flops()["flops"]  # torch's formulas count the matrix products
    result = profile_updates(ours, args.updates)
    matmul_ms = result["kinds"]["matmul"]["ms"]
    result["matmul"] = {
        "gflop": flops / 1e9,
        "gflops_per_s": flops / 1e9 / (matmul_ms / 1e3),
        "roof_gflops_per_s": roof(1024, torch.device("cpu"), torch.float32) / 1e9,
    }
    result.update(
        obs=args.obs,
        mode=args.mode,
        threads=args.threads,
        s_per_update_unprofiled=timed,
        load_average=[load_before, os.getloadavg()],
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command="python benchmarks/profile_update.py " + " ".join(argv),
        torch=torch.__version__,
    )
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
