"""Collection throughput: env steps per second received by the driver, four ways, in one
run on the same env, cores and DreamerV3 policy.

    python benchmarks/collect.py                       # crafter + cartpole, tiny + size1m
    python benchmarks/collect.py --envs crafter --models size1m --workers 4 --json out.json
    python benchmarks/collect.py --quick   # crafter, tiny, 0.2 s a path: the suite's

(a) limit: the env alone (random actions) x min(workers, cores); (b) stock: torchrl's
synchronous ``Collector`` over a ``SerialEnv``, the policy in the driver; (c) chunk1: the
trainer's ``AsyncBatchedCollector``, one transition per message; (d) chunk64: 64 per
message (the default). Trailing ``key=value`` arguments override every path's config.
The design's figure: 361 env steps/s on the stock path, 1,249 on ours (3.46x), a GPU
node's many cores; on few cores the env workers and inference process share them.
``--json`` writes ``{"<env>": {"limit", "stock", "chunk1", "chunk64", "model", "models":
{"<model>": {...}}, "machine"}}``, the top-level figures size1m's where measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torchrl.collectors import Collector
from torchrl.envs import SerialEnv

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.procs import cpu_model  # noqa: E402
from dreamer.agent.build import latent_sizes  # noqa: E402
from dreamer.command_line import load  # noqa: E402
from dreamer.data.collect import build_policy, env_seeds, make_collector  # noqa: E402
from dreamer.data.forkserver import start_forkserver  # noqa: E402
from dreamer.envs.make import make_env, probe_env  # noqa: E402
from dreamer.runtime.cores import usable_cores  # noqa: E402

ENVS = {"crafter": ["env=crafter"], "cartpole": ["env=cartpole"]}
PATHS = ("limit", "stock", "chunk1", "chunk64")


def timed(batches, seconds: float, warmup: float) -> float:
    """Env steps/s over ``seconds`` of ``batches``, after ``warmup`` seconds."""
    iterator = iter(batches)
    started = time.perf_counter()
    while time.perf_counter() - started < warmup:
        next(iterator)
    frames, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        frames += next(iterator).numel()
    return frames / (time.perf_counter() - started)


class Setup:
    def __init__(self, env_name: str, model: str, workers: int, overrides: list[str]):
        cfg = load([*ENVS[env_name], f"model={model}", f"run.envs={workers}", *overrides])
        self.cfg = cfg
        self.env = cfg.env
        self.model = cfg.model
        self.latent = latent_sizes(cfg.model)
        self.spaces, _, self.sample = probe_env(self.env, 0, self.latent)
        self.workers = workers

    def limit(self, seconds: float) -> float:
        env = make_env(self.env, 0)
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            steps += env.rollout(256, break_when_any_done=False).numel()
        rate = steps / (time.perf_counter() - started)
        env.close()
        return rate * min(self.workers, usable_cores())

    def stock(self, seconds: float, warmup: float) -> float:
        makers = [
            functools.partial(make_env, self.env, seed, self.latent)
            for seed in env_seeds(0, 0, self.workers)
        ]
        device = "cuda" if self.cfg.collector.inference.static_batch else "cpu"
        threads = torch.get_num_threads()
        policy = build_policy(self.model, self.spaces, 0, threads, device)
        collector = Collector(
            SerialEnv(self.workers, makers),
            policy,
            frames_per_batch=64 * self.workers,
            total_frames=-1,
            env_device="cpu",
            policy_device=device,
            storing_device="cpu",
        )
        try:
            return timed(collector, seconds, warmup)
        finally:
            collector.shutdown()

    def asynchronous(self, chunk: int, seconds: float, warmup: float) -> float:
        # its processes forked from this one, as the trainer's (a spawned forkserver
        # imported torch and torchrl anew: ~4 s of CPU); a no-op once one serves
        start_forkserver(self.cfg)
        collector_cfg = OmegaConf.to_container(self.cfg.collector) | {"chunk": chunk}
        collector = make_collector(
            env=self.env, model=self.model, spaces=self.spaces, sample=self.sample,
            policy=build_policy(self.model, self.spaces, 0, torch.get_num_threads()),
            envs=self.workers,
            collector=collector_cfg, seed=0, replay=None,
        )  # fmt: skip
        try:
            return timed(collector, seconds, warmup)
        finally:
            collector.shutdown()


DESIGN = {"stock": 361.0, "chunk64": 1249.0}  # env steps/s


def measure(
    env_name: str, model: str, workers: int, seconds: float, overrides: list[str], warmup=2.0
) -> dict[str, float]:
    setup = Setup(env_name, model, workers, overrides)
    return {
        "limit": setup.limit(seconds),
        "stock": setup.stock(seconds, warmup),
        "chunk1": setup.asynchronous(1, seconds, warmup),
        "chunk64": setup.asynchronous(64, seconds, warmup),
    }


def table(results: dict[str, dict[str, float]]) -> str:
    lines = [
        "| env / model | (a) limit | (b) stock | (c) chunk 1 | (d) chunk 64 | d/b | d/a | d/c |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rates in results.items():
        a, b, c, d = (rates[path] for path in PATHS)
        lines.append(
            f"| {name} | {a:.0f} | {b:.0f} | {c:.0f} | {d:.0f} | "
            f"{d / b:.2f} | {d / a:.2f} | {d / c:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--models", nargs="+", default=["tiny", "size1m"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured per path")
    parser.add_argument("--quick", action="store_true", help="crafter, tiny, 0.2 s a path")
    parser.add_argument("--json", type=Path)
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args()
    warmup = 2.0
    if args.quick:
        args.envs, args.models, args.seconds, warmup = ["crafter"], ["tiny"], 0.2, 0.2
    results = {}
    for env_name in args.envs:
        for model in args.models:
            rates = measure(env_name, model, args.workers, args.seconds, args.overrides, warmup)
            results[f"{env_name}/{model}"] = rates
            shown = ", ".join(f"{path} {rate:.0f}" for path, rate in rates.items())
            print(f"{env_name}/{model}: {shown}", flush=True)
    print(
        f"\nenv steps/s received by the driver; {args.workers} workers, {usable_cores()} cores, "
        f"{cpu_model()}, torch {torch.__version__}"
    )
    print(table(results))
    design = DESIGN["chunk64"] / DESIGN["stock"]
    print(
        f"design: stock {DESIGN['stock']:.0f} -> ours {DESIGN['chunk64']:,.0f} env steps/s "
        f"({design:.2f}x, d/b) on a GPU node's many cores; here {usable_cores()} cores carry "
        "the env workers, the inference process and the driver"
    )
    if args.json:
        machine = f"{usable_cores()} cores, {args.workers} workers, {cpu_model()}"
        output = {}
        for env_name in args.envs:
            models = {model: results[f"{env_name}/{model}"] for model in args.models}
            goal = "size1m" if "size1m" in models else args.models[0]
            output[env_name] = {**models[goal], "model": goal, "models": models}
            output[env_name]["machine"] = machine
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(output, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
