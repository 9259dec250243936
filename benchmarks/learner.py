"""Learner speed per mode, measured in one run on the current device.

    python benchmarks/learner.py [--obs pixels|vector] [--model size1m] [--batch 16]
                                 [--length 64] [--updates N] [--modes ...] [--json PATH]
                                 [override ...]   # e.g. experiment=dmc_proprio_cpu

``--obs pixels``: a real Crafter batch (64x64 images, 17 discrete actions);
``--obs vector``: a DMC-like batch, a 24-dim proprio observation and a 6-dim
continuous action (random data: the speed does not depend on the values).
Modes, each on a fresh agent with the same weights and the same batch:
  torchrl_eager            torchrl's losses (tests/torchrl_reference.py) through its
                           DreamerV3OptimizationStepper + DreamerV3Optimizer, eager fp32
                           (the baseline)
  torchrl_compiled         the same with the stepper's own torch.compile (on request:
                           minutes of compiling on a CPU)
  ours                     the project's learner as configured for this device
                           (compile/cudagraph/precision = auto)
  fewer_starts             CPU: ours, imagining from a quarter of the replayed states
                           (learner.imag_last = length / 4, the last steps of each sequence)
  compiled                 CPU: ours with learner.compile=true (on request; a cold cache
                           compiles, see XDG_CACHE_HOME in the README)
  bf16, compiled_bf16      CPU with bf16 instructions: learner.precision=bf16, eager and
                           compiled
  eager_fp32               CUDA only: compile, CUDA graph and bf16 off
  compiled_cudagraph_bf16  CUDA only: all three on
The timed updates of all modes are interleaved (one update of each mode per round) so
a machine shared with other work slows every mode alike; each mode reports its median.
The roof is the GFLOP/s of a 2048 x 2048 fp32 matmul measured in the same run (best of
before and after). FLOPs per update are counted once per path with torch's FLOP formulas
on an eager update (forward + backward): ours executes fewer (imagination
without autograd, shared critic logits), so "share" is executed FLOP/s over the roof and
"vs torchrl_eager" is the ratio of replayed steps/s. Set-up and warm-up (compiling
included) are timed apart from the updates.
``--json PATH`` writes {"device", "obs", "model", "batch", "length", "roof_flops_per_s",
"modes": {"<mode>": {"updates_per_s", "replayed_steps_per_s", "flops_per_update",
"flops_per_s", "roof_share", "setup_s", "seconds", with ``--placement`` "placement":
{"near" | "far" | "mixed": {"n", "s"}}}}}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torchrl.trainers.algorithms import DreamerV3OptimizationStepper, DreamerV3Optimizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flop_count import FlopCount  # noqa: E402  (this script's folder)
from matmul_roof import roof  # noqa: E402
from placement import Probe, by_placement, where  # noqa: E402

from dreamer.agent.build import build_agent  # noqa: E402
from dreamer.agent.spaces import EnvSpaces, ObsKey  # noqa: E402
from dreamer.config import load  # noqa: E402
from dreamer.data.replay import random_batch  # noqa: E402
from dreamer.learning.learner import Learner, cpu_has_bf16  # noqa: E402
from dreamer.runtime.dist import World  # noqa: E402
from tests.batches import real_batch  # noqa: E402
from tests.torchrl_reference import TorchrlReference  # noqa: E402


class TorchrlStepper:
    """torchrl's losses through its stepper as its documentation builds it: eager, with
    its own compile, or (``fast``, CUDA) compiled, CUDA-graph captured and bf16 autocast;
    warmed up on the first batch."""

    def __init__(self, agent, cfg, device, compiled: bool = False, fast: bool = False):
        loss = TorchrlReference(agent.loss.to(device))
        optimizer = DreamerV3Optimizer(
            loss.parameters(), lr=cfg.learner.lr, agc=cfg.learner.grad_clip, warmup_steps=1
        )
        self.stepper = DreamerV3OptimizationStepper(
            loss, optimizer, agent.target_updater, compile_train_step=compiled or fast,
            cudagraph=fast, mixed_precision=fast,
        )  # fmt: skip
        self.device = device
        self.warm = not (compiled or fast)

    def update(self, batch):
        batch = batch.to(self.device)
        if not self.warm:
            self.stepper.warmup(batch)
            self.warm = True
        self.stepper.step(None, batch)


TORCHRL = {  # mode -> (compiled, fast)
    "torchrl_eager": (False, False),
    "torchrl_compiled": (True, False),
    "torchrl_compiled_cudagraph_bf16": (True, True),
}


def modes(device: torch.device, last: int) -> dict[str, list[str] | None]:
    """Mode name -> learner overrides (None: torchrl's own stepper)."""
    common = {"torchrl_eager": None, "torchrl_compiled": None, "ours": []}
    if device.type == "cuda":
        fixed = ["learner.cudagraph=false"]
        return {
            **common,
            "eager_fp32": ["learner.compile=false", *fixed, "learner.precision=fp32"],
            "eager_bf16": ["learner.compile=false", *fixed, "learner.precision=bf16"],
            "compiled_fp32": ["learner.compile=true", *fixed, "learner.precision=fp32"],
            "compiled_cudagraph_bf16": ["learner.compile=true", "learner.cudagraph=true"]
            + ["learner.precision=bf16"],
            "torchrl_compiled_cudagraph_bf16": None,
        }
    cpu = {**common, "fewer_starts": [f"learner.imag_last={last}"]}
    cpu["compiled"] = ["learner.compile=true"]
    if cpu_has_bf16():
        cpu["bf16"] = ["learner.precision=bf16"]
        cpu["compiled_bf16"] = ["learner.compile=true", "learner.precision=bf16"]
    return cpu


def default_modes(device: torch.device) -> list[str]:
    if device.type == "cuda":
        return list(modes(device, 0))
    return ["torchrl_eager", "ours", "fewer_starts"]


def eager_overrides(overrides: list[str]) -> list[str]:
    """The eager equivalent of a mode, whose FLOPs are counted."""
    return [o for o in overrides if not o.startswith(("learner.compile", "learner.cudagraph"))]


def matmul_roof(device: torch.device, size: int = 2048) -> float:
    """FLOP/s of a large fp32 matmul on ``device``: the best of a few timed rounds."""
    return max(roof(size, device, torch.float32) for _ in range(3))


def solo_seconds(learner, batch, updates: int = 3) -> float:
    """Seconds per update timed alone (CUDA: cheap next to compiling)."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(updates):
        learner.update(batch)
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / updates


def vector_spaces() -> EnvSpaces:
    """DMC-like proprioception: 24 observation dims, 6 continuous action dims."""
    return EnvSpaces((ObsKey("observation", (24,), "vector"),), 6, discrete=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--obs", choices=("pixels", "vector"), default="pixels")
    parser.add_argument("--model", default="size1m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--updates", type=int, default=0, help="timed; 0: 5 on CPU, 30 on CUDA")
    parser.add_argument("--modes", nargs="+", help="default: every mode but compiled ones")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--roof-size", type=int, default=2048, help="the roof's matmul size")
    parser.add_argument(
        "--placement",
        action="store_true",
        help="CPU: probe where the host put the first two cores around each timed update "
        "(benchmarks/placement.py) and report each mode's median per placement",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="config overrides after the options' (experiment=dmc_proprio_cpu: a run's model "
        "and learner exactly; --model, --batch and --length still set theirs)",
    )
    args = parser.parse_args()
    device = World().device("auto")
    chosen = args.modes or default_modes(device)
    if "torchrl_eager" not in chosen:
        chosen.insert(0, "torchrl_eager")  # the baseline of every ratio
    updates = args.updates or (30 if device.type == "cuda" else 5)
    env = "env=crafter" if args.obs == "pixels" else "env=cartpole"
    preset = any(o.startswith("experiment=") for o in args.overrides)  # it names its env
    base = [*([] if preset else [env]), *args.overrides, f"model={args.model}"]
    base += [f"replay.batch={args.batch}"]
    base += [f"replay.length={args.length}", "learner.warmup=1"]
    cfg = load(base)
    if args.obs == "pixels":
        spaces, batch = real_batch(cfg, args.batch, args.length)
    else:
        spaces = vector_spaces()
        batch = random_batch(spaces, args.batch, args.length)

    def agent(learner_cfg=cfg.learner):
        """Fresh weights (seed 0); ``learner_cfg`` matters: its loss settings are built in."""
        torch.manual_seed(0)
        return build_agent(cfg.model, learner_cfg, spaces)

    def count_flops(make) -> int:
        with FlopCount() as counter:
            make().update(batch)
        return counter.total

    roof_before = matmul_roof(device, args.roof_size)
    all_modes = modes(device, max(2, args.length // 4))
    learners, setup, flops = {}, {}, {}
    counted: dict[tuple, int] = {}
    for name in chosen:
        overrides = all_modes[name]
        if overrides is None:
            make = lambda name=name: TorchrlStepper(agent(), cfg, device, *TORCHRL[name])  # noqa: E731
            flop_key = ("torchrl",)
            if flop_key not in counted:
                counted[flop_key] = count_flops(lambda: TorchrlStepper(agent(), cfg, device))
        else:
            mode_cfg = load(base + overrides)
            make = lambda mode_cfg=mode_cfg: Learner(  # noqa: E731
                agent(mode_cfg.learner), mode_cfg.learner, device
            )
            eager = eager_overrides(overrides)
            flop_key = tuple(eager)
            if flop_key not in counted:
                eager_cfg = load(
                    base + eager + ["learner.compile=false", "learner.cudagraph=false"]
                )
                counted[flop_key] = count_flops(
                    lambda c=eager_cfg: Learner(agent(c.learner), c.learner, device)
                )
        flops[name] = counted[flop_key]
        started = time.perf_counter()
        learner = make()
        for _ in range(2):  # compiles / captures on the first, settles on the second
            learner.update(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        setup[name] = time.perf_counter() - started
        learners[name] = learner
        print(f"{name}: set-up and warm-up {setup[name]:.0f} s", flush=True)
        if device.type == "cuda":  # a figure per mode even if a later one runs out of time
            print(f"{name}: {solo_seconds(learner, batch):.3f} s/update "
                  f"(set-up and warm-up {setup[name]:.0f} s)", flush=True)  # fmt: skip

    times: dict[str, list[float]] = {name: [] for name in learners}
    probe = Probe() if args.placement and device.type == "cpu" else None
    places: dict[str, list[str]] = {name: [] for name in learners}
    for _ in range(updates):  # interleaved: one update of every mode per round
        for name, learner in learners.items():
            before = probe() if probe else 0.0
            started = time.perf_counter()
            learner.update(batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - started)
            if probe:
                places[name].append(where(before, probe()))
    if probe:
        probe.close()
    roof = max(roof_before, matmul_roof(device, args.roof_size))

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
        if probe:
            results[name]["placement"] = by_placement(samples, places[name])
    baseline = results["torchrl_eager"]["updates_per_s"]
    print(
        f"\n{args.obs}, {args.model}, batch {args.batch} x {args.length}, {device}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"matmul roof {roof / 1e9:.1f} GFLOP/s"
    )
    print(
        "| mode | updates/s | replayed steps/s | GFLOP/update | GFLOP/s | share of roof "
        "| set-up + warm-up s | vs torchrl_eager |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['updates_per_s']:.3f} | {r['replayed_steps_per_s']:.0f} | "
            f"{r['flops_per_update'] / 1e9:.1f} | {r['flops_per_s'] / 1e9:.1f} | "
            f"{r['roof_share']:.0%} | {r['setup_s']:.0f} | {r['updates_per_s'] / baseline:.2f}x |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "device": str(device),
            "obs": args.obs,
            "model": args.model,
            "batch": args.batch,
            "length": args.length,
            "threads": torch.get_num_threads(),
            "roof_flops_per_s": roof,
            "modes": results,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
