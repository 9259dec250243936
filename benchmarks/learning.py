"""Learning checks: train with the real trainer, read its metrics, compare to a threshold.

    python benchmarks/learning.py cartpole                 # 3 seeds, 50k env steps each
    python benchmarks/learning.py cue --seeds 0 1 2
    python benchmarks/learning.py cartpole --steps 20000   # a shorter CPU budget

Each seed runs ``python -m dreamer.train`` in a subprocess. The score of a seed is its
eval return: the mean return of ``eval_episodes`` greedy (mode-policy) episodes of
the final checkpoint in a fresh env (``dreamer.evaluate``). Writes
``benchmarks/results/<check>.json`` and ``<check>.png`` (training-episode returns of
every seed vs env steps, with the threshold and reference lines) and exits 1 when the
mean score misses the threshold. ``--reuse`` scores finished seed runs again without
training.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dreamer.evaluate import evaluate

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "benchmarks" / "results"


@dataclass
class Check:
    overrides: list[str]
    steps: int
    threshold: float
    reference: float  # a random policy's return
    reference_name: str
    eval_episodes: int = 10
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])


CHECKS = {
    "cartpole": Check(["experiment=cartpole"], 50_000, 450.0, 22.0, "random policy (~22)"),
    "cue": Check(["experiment=cue"], 3_000, 8.0, 4.0, "random policy (length / cues = 4)"),
}


def read_curve(logdir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    return [(row["env_steps"], row["episode/return"]) for row in rows if "episode/return" in row]


def run_seed(name: str, check: Check, seed: int, steps: int, extra: list[str], reuse: bool) -> dict:
    logdir = RESULTS / name / f"seed{seed}"
    if reuse:
        returns = evaluate(logdir, episodes=check.eval_episodes).returns
        saved = json.loads((logdir / "seconds.json").read_text())["seconds"]
        return _seed_result(seed, saved, returns, read_curve(logdir))
    if logdir.exists():
        for path in sorted(logdir.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    command = [
        sys.executable,
        "-m",
        "dreamer.train",
        *check.overrides,
        f"run.seed={seed}",
        f"run.steps={steps}",
        f"run.logdir={logdir}",
        "run.progress=false",
        *extra,
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    (logdir / "seconds.json").write_text(json.dumps({"seconds": seconds}))
    return _seed_result(
        seed, seconds, evaluate(logdir, episodes=check.eval_episodes).returns, read_curve(logdir)
    )


def _seed_result(seed: int, seconds: float, returns: list[float], curve: list) -> dict:
    score = sum(returns) / len(returns)
    return {"seed": seed, "seconds": seconds, "score": score, "returns": returns, "curve": curve}


def plot(name: str, check: Check, runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for run in runs:
        steps, values = zip(*run["curve"])
        axis.plot(steps, values, alpha=0.35, linewidth=1, label=f"seed {run['seed']}")
    axis.axhline(check.threshold, color="green", linestyle="--", label="threshold")
    axis.axhline(check.reference, color="grey", linestyle=":", label=check.reference_name)
    axis.set_xlabel("env steps")
    axis.set_ylabel("episode return")
    axis.set_title(f"{name}: training episode return")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("check", choices=sorted(CHECKS))
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--steps", type=int, help="env-step budget per seed")
    parser.add_argument("--reuse", action="store_true", help="re-score finished seed runs")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (key=value)")
    argv = sys.argv[1:]
    # overrides may follow --seeds, whose int list would otherwise swallow them
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = parser.parse_args([a for a in argv if a not in overrides])
    args.overrides = overrides
    check = CHECKS[args.check]
    seeds = args.seeds or check.seeds
    steps = args.steps or check.steps
    RESULTS.mkdir(parents=True, exist_ok=True)
    runs = [run_seed(args.check, check, seed, steps, args.overrides, args.reuse) for seed in seeds]
    scores = [run["score"] for run in runs]
    mean = sum(scores) / len(scores)
    result = {
        "check": args.check,
        "passed": mean >= check.threshold,
        "threshold": check.threshold,
        "budget_steps": steps,
        "seeds": seeds,
        "final_mean": mean,
        "final_min": min(scores),
        "final_max": max(scores),
        "seconds_per_seed": [round(run["seconds"]) for run in runs],
        "eval_returns": {run["seed"]: run["returns"] for run in runs},
        "eval_episodes": check.eval_episodes,
        "reference": check.reference,
        "overrides": check.overrides + args.overrides,
        "date": datetime.date.today().isoformat(),
        "hardware": f"{platform.machine()}, {platform.processor() or 'cpu'}",
    }
    (RESULTS / f"{args.check}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(args.check, check, runs, RESULTS / f"{args.check}.png")
    print(json.dumps(result, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
