"""Learner speed per mode, measured in one run on the current device.

    python benchmarks/learner.py [--model size1m] [--batch 16] [--length 64] [--json PATH]

Modes, each on a fresh agent with the same weights and the same real Crafter batch:
  torchrl_eager            torchrl's own DreamerV3OptimizationStepper + DreamerV3Optimizer,
                           eager fp32 (the baseline)
  ours                     the project's learner as configured for this device
                           (learner.compile/cudagraph/precision = auto)
  fewer_starts             CPU: the project's learner imagining from a quarter of the
                           replayed states (learner.imag_starts = batch x length / 4, an
                           option of the DreamerV3 recipe)
  compiled                 the project's learner with learner.compile=true; on the CPU
                           only with --modes (compiling takes ~4 minutes there)
  compiled_fewer_starts    CPU, with --modes: both
  eager_fp32               CUDA only: compile, CUDA graph and bf16 off
  compiled_cudagraph_bf16  CUDA only: all three on
  torchrl_compiled_cudagraph_bf16
                           CUDA only: torchrl's stepper with its compile, CUDA-graph
                           capture and bf16 autocast on
Prints updates/s, replayed steps/s (batch x length per update) and achieved FLOP/s,
as ratios to torchrl_eager; the model FLOPs per update are counted once with
torch's FLOP formulas on an eager update (forward + backward).
``--json PATH`` writes {"device", "model", "batch", "length", "flops_per_update",
"modes": {"<mode>": {"updates_per_s", "replayed_steps_per_s", "flops_per_s"}}}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry
from torchrl.trainers.algorithms import DreamerV3OptimizationStepper, DreamerV3Optimizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dreamer.agent.build import build_agent  # noqa: E402
from dreamer.config import load  # noqa: E402
from dreamer.dist import World  # noqa: E402
from dreamer.learner import Learner  # noqa: E402
from tests.batches import real_batch  # noqa: E402


class FlopCount(TorchDispatchMode):
    """torch's FLOP formulas (matmuls, convolutions, attention) over every op dispatched;
    torch's own FlopCounterMode cannot track modules that take tensordicts."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


class TorchrlStepper:
    """torchrl's stepper as its documentation builds it: eager, or (``fast``) compiled,
    CUDA-graph captured and bf16 autocast, warmed up on the first batch."""

    def __init__(self, agent, cfg, device, fast: bool = False):
        loss = agent.loss.to(device)
        optimizer = DreamerV3Optimizer(
            loss.parameters(), lr=cfg.learner.lr, agc=cfg.learner.grad_clip, warmup_steps=1
        )
        self.stepper = DreamerV3OptimizationStepper(
            loss, optimizer, agent.target_updater, compile_train_step=fast, cudagraph=fast,
            mixed_precision=fast,
        )  # fmt: skip
        self.device = device
        self.warm = not fast

    def update(self, batch):
        batch = batch.to(self.device)
        if not self.warm:
            self.stepper.warmup(batch)
            self.warm = True
        self.stepper.step(None, batch)


def modes(device: torch.device, starts: int) -> dict[str, list[str]]:
    """Mode name -> learner overrides (None: torchrl's own stepper)."""
    if device.type == "cuda":
        return {
            "torchrl_eager": None,
            "ours": [],
            "eager_fp32": ["learner.compile=false", "learner.cudagraph=false"]
            + ["learner.precision=fp32"],
            "compiled_cudagraph_bf16": ["learner.compile=true", "learner.cudagraph=true"]
            + ["learner.precision=bf16"],
            "torchrl_compiled_cudagraph_bf16": None,
        }
    fewer = [f"learner.imag_starts={starts}"]
    return {
        "torchrl_eager": None,
        "ours": [],
        "fewer_starts": fewer,
        "compiled": ["learner.compile=true"],
        "compiled_fewer_starts": ["learner.compile=true", *fewer],
    }


def default_modes(device: torch.device) -> list[str]:
    if device.type == "cuda":
        return list(modes(device, 0))
    return ["torchrl_eager", "ours", "fewer_starts"]


def measure(make, batch, updates: int, device: torch.device) -> tuple[float, float]:
    """(seconds of set-up + warm-up, seconds per update)."""
    started = time.perf_counter()
    learner = make()
    for _ in range(2):  # compiles / captures on the first, settles on the second
        learner.update(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    ready = time.perf_counter()
    for _ in range(updates):
        learner.update(batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return ready - started, (time.perf_counter() - ready) / updates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="size1m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--updates", type=int, default=0, help="timed; 0: 5 on CPU, 30 on CUDA")
    parser.add_argument("--modes", nargs="+", help="default: every mode but CPU compiled")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = World().device("auto")
    chosen = args.modes or default_modes(device)
    if "torchrl_eager" not in chosen:
        chosen.insert(0, "torchrl_eager")  # the baseline of every ratio
    updates = args.updates or (30 if device.type == "cuda" else 5)
    base = ["env=crafter", f"model={args.model}", f"replay.batch={args.batch}"]
    base += [f"replay.length={args.length}", "learner.warmup=1"]
    cfg = load(base)
    spaces, batch = real_batch(cfg, args.batch, args.length)

    def agent():
        torch.manual_seed(0)
        return build_agent(cfg.model, cfg.learner, spaces)

    with FlopCount() as counter:  # on the device: a size50m update takes long on a CPU
        TorchrlStepper(agent(), cfg, device).update(batch)
    flops = counter.total
    results = {}
    for name, overrides in modes(device, args.batch * args.length // 4).items():
        if name not in chosen:
            continue
        if overrides is None:
            fast = name != "torchrl_eager"
            make = lambda fast=fast: TorchrlStepper(agent(), cfg, device, fast)  # noqa: E731
        else:
            mode_cfg = load(base + overrides)
            make = lambda mode_cfg=mode_cfg: Learner(agent(), mode_cfg.learner, device)  # noqa: E731
        setup, seconds = measure(make, batch, updates, device)
        results[name] = {
            "updates_per_s": 1 / seconds,
            "replayed_steps_per_s": args.batch * args.length / seconds,
            "flops_per_s": flops / seconds,
            "setup_s": setup,
        }
        print(f"{name}: {seconds:.3f} s/update (set-up and warm-up {setup:.0f} s)", flush=True)
    baseline = results["torchrl_eager"]["updates_per_s"]
    print(
        f"\n{args.model}, batch {args.batch} x {args.length}, {device}, torch {torch.__version__}, "
        f"{flops / 1e9:.1f} GFLOP per update"
    )
    print("| mode | updates/s | replayed steps/s | GFLOP/s | vs torchrl_eager |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['updates_per_s']:.3f} | {r['replayed_steps_per_s']:.0f} | "
            f"{r['flops_per_s'] / 1e9:.1f} | {r['updates_per_s'] / baseline:.2f}x |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "device": str(device),
            "model": args.model,
            "batch": args.batch,
            "length": args.length,
            "flops_per_update": flops,
            "modes": results,
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
