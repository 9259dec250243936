"""Learning checks: train with the real trainer, read its metrics, compare to a threshold.

    python benchmarks/learning.py cartpole                  # 3 seeds, 50k env steps each
    python benchmarks/learning.py crafter --budget 5000 model=size1m   # a CPU-sized run
    python benchmarks/learning.py dmc --task cartpole_balance --budget 50000 --seeds 0

Each seed runs ``python -m dreamer.train`` (``key=value`` arguments passed on) and is scored
on its final checkpoint by ``dreamer.evaluate`` (greedy episodes' mean return; Crafter's
score for ``crafter``); ``dmc`` and ``atari`` compare with 90% of the official DreamerV3
mean at the same budget (``benchmarks/official/dreamerv3_scores.json``). Writes
``benchmarks/results/<check>.{json,png}``; exits 1 below the threshold.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.procs import cpu_model  # noqa: E402
from dreamer.errors import ConfigError  # noqa: E402
from dreamer.evaluate import evaluate  # noqa: E402
from dreamer.evaluation.reports import crafter_score  # noqa: E402
from dreamer.evaluation.runner import EvalResult  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
OFFICIAL = json.loads((ROOT / "benchmarks" / "official" / "dreamerv3_scores.json").read_text())
SHARE_OF_OFFICIAL = 0.9


@dataclass
class Check:
    overrides: list[str]
    steps: int
    threshold: float
    reference: float | None  # a random policy's score; None: measured (crafter)
    reference_name: str
    metric: str = "return"  # or "crafter_score"
    curve_evals: int = 0  # evaluations during training, for the curve (else episode returns)
    eval_episodes: int = 10
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    official: dict | None = None  # the official score at the budget, its units and source
    official_curve: tuple[list[int], list[list[float]]] | None = None  # steps, seeds x steps


CHECKS = {
    "cartpole": Check(["experiment=cartpole"], 50_000, 450.0, 22.0, "random policy (~22)"),
    "pixels": Check(
        ["experiment=pixels"], 4_000, 12.0, 4.0, "random (length / cues = 4)", eval_episodes=16
    ),
    # the paper's protocol: default size preset, train ratio 512, 1M steps, 14.5% at 1M
    "crafter": Check(
        ["env=crafter", "run.train_ratio=512", "run.envs=1"],
        1_000_000,
        14.5,
        None,
        "random policy (measured)",
        metric="crafter_score",
        curve_evals=5,
        eval_episodes=10,
    ),
    "cue": Check(["experiment=cue"], 3_000, 8.0, 4.0, "random policy (length / cues = 4)"),
}


def dmc_check(task: str, budget: int | None) -> Check:
    """``experiment=dmc_proprio`` on one task; the official mean at ``budget`` env steps
    (dmc_proprio's repeat 1 makes agent steps env steps, the score file's x axis)."""
    reference = OFFICIAL["dmc_proprio"]
    table = reference["table_500k"]["scores"]
    if task not in table:
        raise ConfigError(f"no official DMC proprio score for {task!r}; known: {', '.join(table)}")
    steps = budget or 100_000
    official: dict = {"units": reference["y_units"], "protocol": reference["protocol"]}
    curve = None
    if task in reference["curves"]:
        grid, seeds = reference["steps"], reference["curves"][task]
        curve = (grid, seeds)
        if steps in grid:
            at = grid.index(steps)
            official |= {"mean": float(np.mean([seed[at] for seed in seeds]))}
            official |= {"source": reference["source"], "seeds": len(seeds)}
    if steps == 500_000:
        official |= {"mean": float(table[task]), "source": reference["table_500k"]["source"]}
    if "mean" not in official:
        known = f"{reference['steps'][0]}-{reference['steps'][-1]} in steps of 10000 or 500000"
        where = known if task in reference["curves"] else "500000"
        raise ConfigError(
            f"no official {task} score at {steps} env steps; budgets with one: {where}"
        )
    return Check(
        ["experiment=dmc_proprio", f"env.task={task}"],
        steps,
        SHARE_OF_OFFICIAL * official["mean"],
        None,
        "random policy (measured)",
        official=official,
        official_curve=curve,
    )


def atari_check(game: str, budget: int | None) -> Check:
    """``experiment=atari100k`` on one game; the official score after 100k agent steps."""
    reference = OFFICIAL["atari100k"]
    if game not in reference["scores"]:
        known = ", ".join(reference["scores"])
        raise ConfigError(f"no official Atari100k score for {game!r}; known: {known}")
    steps = budget or reference["budget_steps"]
    if steps != reference["budget_steps"]:
        only = reference["budget_steps"]
        raise ConfigError(f"the official Atari100k scores are at {only} agent steps, not {steps}")
    official = {"mean": float(reference["scores"][game]), "units": reference["x_units"]}
    official |= {"source": reference["source"]}
    return Check(
        ["experiment=atari100k", f"env.game={game}"],
        steps,
        SHARE_OF_OFFICIAL * official["mean"],
        None,
        "random policy (measured)",
        official=official,
    )


def resolve(name: str, task: str | None, game: str | None, budget: int | None) -> tuple[str, Check]:
    """The check's result name and settings; ``dmc``/``atari`` are one check per task/game."""
    if name == "dmc":
        task = task or "cartpole_balance"
        return f"dmc_{task}", dmc_check(task, budget)
    if name == "atari":
        game = game or "pong"
        return f"atari_{game}", atari_check(game, budget)
    if task or game:
        raise ConfigError(f"--task and --game belong to the dmc and atari checks, not {name}")
    return name, CHECKS[name]


def score(check: Check, result: EvalResult) -> float:
    if check.metric == "crafter_score":
        return crafter_score(list(result.achievements.values()))
    return float(np.mean(result.returns))


def read_curve(check: Check, logdir: Path) -> list[tuple[int, float]]:
    """(env step, value): periodic evaluations' scores, or training-episode returns."""
    lines = (logdir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    key = f"eval/{check.metric}" if check.curve_evals else "episode/return"
    return [(row["env_steps"], row[key]) for row in rows if key in row]


def random_reference(check: Check, overrides: list[str], episodes: int) -> float:
    """A uniformly random policy's score on the check's env (crafter)."""
    import torch
    from omegaconf import OmegaConf

    from dreamer.command_line import load
    from dreamer.envs.crafter import ACHIEVEMENTS
    from dreamer.envs.make import make_env
    from dreamer.evaluation.runner import summarize

    cfg = load([*check.overrides, *overrides])
    env = make_env(OmegaConf.to_container(cfg.env), seed=123_456)
    torch.manual_seed(0)
    rollouts = [env.rollout(100_000, break_when_any_done=True) for _ in range(episodes)]
    env.close()
    achievements = ACHIEVEMENTS if check.metric == "crafter_score" else ()
    return score(check, summarize(rollouts, None, achievements))


def run_seed(name: str, check: Check, seed: int, steps: int, extra: list[str], reuse: bool) -> dict:
    logdir = RESULTS / name / f"seed{seed}"
    if not reuse:
        if logdir.exists():
            for path in sorted(logdir.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
        command = [sys.executable, "-m", "dreamer.train", *check.overrides]
        command += [f"run.seed={seed}", f"run.steps={steps}", f"run.logdir={logdir}"]
        command += ["run.progress=false"]
        if check.curve_evals:
            command += [f"eval.every={max(1, steps // check.curve_evals)}"]
        started = time.perf_counter()
        subprocess.run([*command, *extra], check=True, cwd=ROOT)
        seconds = time.perf_counter() - started
        (logdir / "seconds.json").write_text(json.dumps({"seconds": seconds}))
    seconds = json.loads((logdir / "seconds.json").read_text())["seconds"]
    result = evaluate(logdir, episodes=check.eval_episodes)
    return {
        "seed": seed,
        "seconds": seconds,
        "score": score(check, result),
        "returns": result.returns,
        "curve": read_curve(check, logdir),
    }


def plot(name: str, check: Check, runs: list[dict], reference: float, path: Path) -> None:
    """Mean and min-max over seeds, each seed's curve interpolated on a common grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [np.asarray(run["curve"], np.float64) for run in runs if run["curve"]]
    figure, axis = plt.subplots(figsize=(6, 4))
    if curves:
        start = max(curve[0, 0] for curve in curves)
        end = min(curve[-1, 0] for curve in curves)
        grid = np.linspace(start, end, 100) if end > start else np.array([end])
        values = np.stack([np.interp(grid, curve[:, 0], curve[:, 1]) for curve in curves])
        label = f"mean of {len(curves)} seeds"
        axis.plot(grid, values.mean(0), color="tab:blue", label=label)
        axis.fill_between(grid, values.min(0), values.max(0), alpha=0.25, label="min-max")
    if check.official_curve:
        steps, seeds = check.official_curve
        official = np.asarray(seeds, np.float64)
        axis.plot(steps, official.mean(0), color="black", label="official DreamerV3 (mean)")
        axis.fill_between(steps, official.min(0), official.max(0), color="black", alpha=0.1)
    elif check.official:
        axis.plot([check.steps], [check.official["mean"]], "k*", label="official DreamerV3")
    axis.axhline(check.threshold, color="green", linestyle="--", label="threshold")
    axis.axhline(reference, color="grey", linestyle=":", label=check.reference_name)
    axis.set_xlabel("env steps")
    what = "Crafter score (%)" if check.metric == "crafter_score" else "episode return"
    source = "evaluation" if check.curve_evals else "training episodes"
    axis.set_ylabel(what)
    axis.set_title(f"{name}: {what}, {source}")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("check", choices=sorted([*CHECKS, "dmc", "atari"]))
    parser.add_argument("--task", help="dmc: a DMC task with an official score")
    parser.add_argument("--game", help="atari: an Atari100k game with an official score")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--budget", "--steps", type=int, help="env-step budget per seed")
    parser.add_argument("--reuse", action="store_true", help="re-score finished seed runs")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (key=value)")
    argv = sys.argv[1:]
    # overrides may follow --seeds, whose int list would otherwise swallow them
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = parser.parse_args([a for a in argv if a not in overrides])
    try:
        name, check = resolve(args.check, args.task, args.game, args.budget)
    except ConfigError as error:
        print(f"learning.py: {error}", file=sys.stderr)
        return 2
    seeds = args.seeds or check.seeds
    steps = args.budget or check.steps
    RESULTS.mkdir(parents=True, exist_ok=True)
    runs = [run_seed(name, check, seed, steps, overrides, args.reuse) for seed in seeds]
    reference = check.reference
    if reference is None:
        reference = random_reference(check, overrides, check.eval_episodes * len(seeds))
    scores = [run["score"] for run in runs]
    mean = sum(scores) / len(scores)
    official = check.official["mean"] if check.official else None
    result = {"check": name, "passed": mean >= check.threshold, "threshold": check.threshold}
    result |= {"budget_steps": steps, "seeds": seeds, "final_mean": mean}
    result |= {"final_min": min(scores), "final_max": max(scores), "metric": check.metric}
    result |= {"reference": reference, "reference_name": check.reference_name}
    result |= {"above_reference": mean > reference, "official": check.official}
    result |= {"share_of_official": mean / official if official else None}
    result |= {"seconds_per_seed": [round(run["seconds"]) for run in runs]}
    for key, field_ in (("scores", "score"), ("eval_returns", "returns"), ("curves", "curve")):
        result[key] = {run["seed"]: run[field_] for run in runs}
    result |= {"eval_episodes": check.eval_episodes, "overrides": check.overrides + overrides}
    result |= {"date": datetime.date.today().isoformat()}
    result |= {"hardware": f"{cpu_model()}, {os.cpu_count()} cores"}
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(name, check, runs, reference, RESULTS / f"{name}.png")
    print(json.dumps({k: v for k, v in result.items() if k != "curves"}, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
