"""Learner speed per mode, measured in one run on the current device.

    python benchmarks/learner.py [--obs pixels|vector] [--model size1m] [--batch 16]
        [--length 64] [--updates N] [--modes ...] [--json PATH] [override ...]

A random batch in the replay's layout (Crafter's frames, or a 24-dim vector and 6
continuous actions), each mode a fresh agent with the same weights (``modes()``), the
timed updates of all modes interleaved, medians, set-up and warm-up (compiling included)
apart; FLOPs counted on an eager update by torch's formulas, against a square matmul's
roof measured in the same run (fp32 on the CPU, bf16 on CUDA). ``--json`` writes the
figures per mode (``updates_per_s``, ``flops_per_s``, ``roof_share``, ``setup_s``, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.peers.update_worker import torch_flop_counter  # noqa: E402
from dreamer.agent.build import build_agent  # noqa: E402
from dreamer.agent.spaces import EnvSpaces, ObsKey  # noqa: E402
from dreamer.command_line import load  # noqa: E402
from dreamer.data.replay import random_batch  # noqa: E402
from dreamer.envs.make import describe_env  # noqa: E402
from dreamer.learning.learner import Learner, cpu_has_bf16  # noqa: E402
from dreamer.runtime.world import World  # noqa: E402


def modes(device: torch.device, last: int) -> dict[str, list[str]]:
    """Mode name -> learner overrides."""
    if device.type == "cuda":
        fixed = ["learner.cudagraph=false"]
        return {
            "ours": [],
            "eager_fp32": ["learner.compile=false", *fixed, "learner.precision=fp32"],
            "eager_bf16": ["learner.compile=false", *fixed, "learner.precision=bf16"],
            "compiled_fp32": ["learner.compile=true", *fixed, "learner.precision=fp32"],
            "compiled_cudagraph_bf16": ["learner.compile=true", "learner.cudagraph=true"]
            + ["learner.precision=bf16"],
        }
    cpu = {"ours": [], "fewer_starts": [f"learner.imag_last={last}"]}
    cpu["compiled"] = ["learner.compile=true"]
    if cpu_has_bf16():
        cpu["bf16"] = ["learner.precision=bf16"]
        cpu["compiled_bf16"] = ["learner.compile=true", "learner.precision=bf16"]
    return cpu


def matmul_roof(device: torch.device, size: int) -> float:
    """FLOP/s of size^3 products (bf16 on CUDA, fp32 on the CPU), the best of 3 rounds."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    best = 0.0
    for _ in range(3):
        a @ b  # warm-up
        synchronize(device)
        started = time.perf_counter()
        for _ in range(5):
            a @ b
        synchronize(device)
        best = max(best, 2 * size**3 * 5 / (time.perf_counter() - started))
    return best


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--obs", choices=("pixels", "vector"), default="pixels")
    parser.add_argument("--model", default="size1m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--updates", type=int, default=0, help="timed; 0: 5 on CPU, 30 on CUDA")
    parser.add_argument("--modes", nargs="+", help="default: ours and fewer_starts; CUDA: all")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--roof-size", type=int, default=0, help="0: 2048, 8192 on CUDA")
    parser.add_argument("overrides", nargs="*", help="config overrides (experiment=...)")
    args = parser.parse_args()
    device = World().device("auto")
    all_modes = modes(device, max(2, args.length // 4))
    chosen = args.modes or (list(all_modes) if device.type == "cuda" else ["ours", "fewer_starts"])
    updates = args.updates or (30 if device.type == "cuda" else 5)
    roof_size = args.roof_size or (8192 if device.type == "cuda" else 2048)
    env = "env=crafter" if args.obs == "pixels" else "env=cartpole"
    preset = any(o.startswith("experiment=") for o in args.overrides)  # it names its env
    base = [*([] if preset else [env]), *args.overrides, f"model={args.model}"]
    base += [f"replay.batch={args.batch}", f"replay.length={args.length}", "learner.warmup=1"]
    cfg = load(base)
    if args.obs == "pixels":
        spaces, _ = describe_env(cfg.env, 0)
    else:
        spaces = EnvSpaces((ObsKey("observation", (24,), "vector"),), 6, discrete=False)
    batch = random_batch(spaces, args.batch, args.length)

    def learner(overrides: list[str]) -> Learner:
        mode_cfg = load(base + overrides)
        torch.manual_seed(0)  # the same weights in every mode
        return Learner(build_agent(cfg.model, mode_cfg.learner, spaces), mode_cfg.learner, device)

    roof_before = matmul_roof(device, roof_size)
    learners, setup, flops, counted = {}, {}, {}, {}
    for name in chosen:
        overrides = all_modes[name]
        eager = [o for o in overrides if not o.startswith(("learner.compile", "learner.cudagraph"))]
        if tuple(eager) not in counted:
            with torch_flop_counter() as counter:
                learner(eager + ["learner.compile=false", "learner.cudagraph=false"]).update(batch)
            counted[tuple(eager)] = counter.total
        flops[name] = counted[tuple(eager)]
        started = time.perf_counter()
        learners[name] = learner(overrides)
        for _ in range(2):  # compiles / captures on the first, settles on the second
            learners[name].update(batch)
        synchronize(device)
        setup[name] = time.perf_counter() - started
        print(f"{name}: set-up and warm-up {setup[name]:.0f} s", flush=True)
        if device.type == "cuda":  # a figure per mode even if a later one runs out of time
            started = time.perf_counter()
            for _ in range(3):
                learners[name].update(batch)
            synchronize(device)
            seconds = (time.perf_counter() - started) / 3
            print(f"{name}: {seconds:.3f} s/update (set-up and warm-up {setup[name]:.0f} s)")

    times: dict[str, list[float]] = {name: [] for name in learners}
    for _ in range(updates):  # interleaved: one update of every mode per round
        for name, one in learners.items():
            started = time.perf_counter()
            one.update(batch)
            synchronize(device)
            times[name].append(time.perf_counter() - started)
    roof = max(roof_before, matmul_roof(device, roof_size))

    results = {}
    for name, samples in times.items():
        seconds = sorted(samples)[len(samples) // 2]
        results[name] = {
            "updates_per_s": 1 / seconds,
            "replayed_steps_per_s": args.batch * args.length / seconds,
            "flops_per_update": flops[name],
            "flops_per_s": flops[name] / seconds,
            "roof_share": flops[name] / seconds / roof,
            "setup_s": setup[name],
            "seconds": samples,
        }
    first = chosen[0]
    print(
        f"\n{args.obs}, {args.model}, batch {args.batch} x {args.length}, {device}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"matmul roof {roof / 1e9:.1f} GFLOP/s\n| mode | updates/s | replayed steps/s | "
        f"GFLOP/update | GFLOP/s | share of roof | set-up + warm-up s | vs {first} |\n"
        + "|---|---|---|---|---|---|---|---|"
    )
    for name, r in results.items():
        print(
            f"| {name} | {r['updates_per_s']:.3f} | {r['replayed_steps_per_s']:.0f} | "
            f"{r['flops_per_update'] / 1e9:.1f} | {r['flops_per_s'] / 1e9:.1f} | "
            f"{r['roof_share']:.0%} | {r['setup_s']:.0f} | "
            f"{r['updates_per_s'] / results[first]['updates_per_s']:.2f}x |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"device": str(device), "obs": args.obs, "model": args.model}
        payload |= {"batch": args.batch, "length": args.length}
        payload |= {"threads": torch.get_num_threads(), "roof_flops_per_s": roof}
        args.json.write_text(json.dumps(payload | {"modes": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
