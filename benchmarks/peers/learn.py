"""DMC proprio learning runs side by side: ours and the official DreamerV3, one protocol.

    python benchmarks/peers/learn.py --task cartpole_balance --impls ours --seeds 0 1 2
    python benchmarks/peers/learn.py --task cartpole_balance --reuse   # table and plot only

Both train at ``experiment=dmc_proprio_cpu``, the official's ``dreamerv3/main.py`` flags
derived from that preset. Runs go in ``runs/peers/<task>/<impl>-seed<n>`` (a rerun resumes
or reuses them); their training-episode returns, ours' greedy evaluations, wall time,
load and CPU add up in ``benchmarks/results/peers_learn_<task>.{json,png}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes.util
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.peers.update import machine  # noqa: E402
from benchmarks.procs import jsonl_rows  # noqa: E402
from dreamer.command_line import load  # noqa: E402
from dreamer.errors import ConfigError  # noqa: E402

PRESET = "experiment=dmc_proprio_cpu"
RESULTS = ROOT / "benchmarks" / "results"
PEERS = ROOT / ".venv-peers"
SCORES = json.loads((ROOT / "benchmarks" / "official" / "dreamerv3_scores.json").read_text())
EVAL = ["eval.every=10000", "eval.episodes=4"]  # ours' greedy returns beside the training ones
IMPLS = ("ours", "official")
AT_BUDGET = 0.2  # "return at the budget": episodes ending in the last 20% of the steps


def official_source() -> Path:
    """The official source recorded by ``make peers``; ConfigError if not built."""
    venv = PEERS / "official"
    recorded = venv / "OFFICIAL_SRC"
    if not (venv / ".installed").exists() or not recorded.exists():
        raise ConfigError(
            "official: .venv-peers/official is not built; run make peers OFFICIAL_SRC=<a "
            "checkout of github.com/danijar/dreamerv3>"
        )
    return Path(recorded.read_text().strip())


def commands(impl: str, task: str, seed: int, steps: int, logdir: Path) -> tuple[list, dict]:
    """The command line and extra environment of one run."""
    overrides = [PRESET, f"env.task={task}", f"run.seed={seed}", f"run.steps={steps}"]
    if impl == "ours":
        overrides += [*EVAL, f"run.logdir={logdir}", "run.progress=false"]
        return [sys.executable, "-m", "dreamer.train", *overrides], {}
    source = official_source()
    cfg = load(overrides)
    flags = {  # configs.yaml keys, from our preset
        "task": f"dmc_{task}",
        "seed": seed,
        "logdir": logdir,
        "batch_size": cfg.replay.batch,
        "batch_length": cfg.replay.length,
        "run.steps": cfg.run.steps,
        "run.envs": cfg.run.envs,
        "run.train_ratio": cfg.run.train_ratio,
        "env.dmc.repeat": cfg.env.repeat,
        "jax.platform": "cpu",
        "jax.compute_dtype": "float32",
        "logger.outputs": "jsonl",
    }
    command = [str(PEERS / "official" / "bin" / "python"), str(source / "dreamerv3" / "main.py")]
    command += ["--configs", "dmc_proprio"]  # size1m, proprio, its defaults
    for key, value in flags.items():
        command += [f"--{key}", str(value)]
    return command, {"PYTHONPATH": str(source), "MUJOCO_GL": "osmesa"}


def training_returns(impl: str, logdir: Path) -> list[list[float]]:
    """``[env_step, mean return, episodes]`` of the training episodes, in step order."""
    rows = []
    if impl == "ours":
        for row in jsonl_rows(logdir / "metrics.jsonl"):
            if "episode/return" in row and "eval/return" not in row:
                rows.append([row["env_steps"], row["episode/return"], row["episode/count"]])
    else:  # one row per episode; the official logs agent steps x repeat (1 here)
        for row in jsonl_rows(logdir / "scores.jsonl"):
            if "episode/score" in row:
                rows.append([row["step"], row["episode/score"], 1])
    return sorted(rows)


def eval_returns(impl: str, logdir: Path) -> list[list[float]]:
    if impl != "ours":
        return []
    rows = jsonl_rows(logdir / "metrics.jsonl")
    return [[row["env_steps"], row["eval/return"]] for row in rows if "eval/return" in row]


def at_budget(curve: list[list[float]], steps: int) -> float | None:
    """Mean return of the training episodes that ended in the last ``AT_BUDGET`` of the
    budget (with 16 envs and 1000-step episodes they end together every 16k steps)."""
    late = [(ret, n) for step, ret, n in curve if step > steps * (1 - AT_BUDGET)]
    episodes = sum(n for _, n in late)
    return sum(ret * n for ret, n in late) / episodes if episodes else None


def commit() -> str:
    """This tree's commit, ``+`` where dreamer/ has uncommitted changes."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "dreamer"], capture_output=True)
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def finished(impl: str, logdir: Path, steps: int) -> bool:
    if impl == "ours":
        rows = [row for row in jsonl_rows(logdir / "metrics.jsonl") if "eval/return" not in row]
        return bool(rows) and rows[-1]["env_steps"] >= steps
    return (logdir / "done").exists()


def run(impl: str, task: str, seed: int, steps: int, runs: Path, reuse: bool) -> dict | None:
    logdir = runs / task / f"{impl}-seed{seed}"
    command, env = commands(impl, task, seed, steps, logdir)
    record = {"impl": impl, "seed": seed, "steps": steps, "logdir": str(logdir)}
    record["command"] = " ".join([*(f"{k}={v}" for k, v in env.items()), *command])
    info = logdir / "peer_run.json"  # wall time and load of the run that trained it
    if not finished(impl, logdir, steps):
        if reuse:
            return None
        logdir.mkdir(parents=True, exist_ok=True)
        print(f"{impl} seed {seed}: {record['command']}", flush=True)
        load_before, started = os.getloadavg()[0], time.monotonic()
        with (logdir / "peer_run.log").open("a") as log:
            done = subprocess.run(
                command, cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
            )
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"{impl} seed {seed} exited with {done.returncode}: see {log.name}")
        (logdir / "done").touch()
        ran = {"wall_s": round(wall, 1), "load_before": load_before}
        ran |= {"load_after": os.getloadavg()[0], "date": datetime.date.today().isoformat()}
        ran |= {"machine": f"{platform.machine()}, {os.cpu_count()} cores"}
        ran |= {"cpu": machine()["cpu"]}  # machines differ between sessions
        if impl == "ours":  # ours' code: its speed changes between commits
            ran["commit"] = commit()
        info.write_text(json.dumps(ran))
    record |= json.loads(info.read_text()) if info.exists() else {}
    record["training_returns"] = training_returns(impl, logdir)
    record["eval_returns"] = eval_returns(impl, logdir)
    record["return_at_budget"] = at_budget(record["training_returns"], steps)
    return record


def summary(runs: dict, steps: int) -> dict:
    out = {}
    for impl in IMPLS:
        mine = [r for r in runs.values() if r["impl"] == impl and r["steps"] == steps]
        scores = [r["return_at_budget"] for r in mine if r["return_at_budget"] is not None]
        walls = [r["wall_s"] for r in mine if "wall_s" in r]
        if scores:
            out[impl] = {
                "seeds": sorted(r["seed"] for r in mine),
                "mean_return_at_budget": float(np.mean(scores)),
                "range": [float(min(scores)), float(max(scores))],
                "mean_wall_s": float(np.mean(walls)) if walls else None,
            }
    if {"ours", "official"} <= set(out):
        ours, official = out["ours"], out["official"]
        share = ours["mean_return_at_budget"] / max(official["mean_return_at_budget"], 1e-9)
        out["ours_vs_official"] = {
            "return_share": share,
            "inside_official_range": official["range"][0]
            <= ours["mean_return_at_budget"]
            <= official["range"][1],
            "wall_ratio_by_cpu": wall_ratios(runs, steps),
        }
    return out


def wall_ratios(runs: dict, steps: int) -> dict:
    """Ours' mean wall time over the official's, per CPU model that ran both: the
    machine differs between sessions, and a ratio across two CPUs would measure them."""
    walls: dict[str, dict[str, list[float]]] = {}
    for r in runs.values():
        if r["steps"] == steps and "wall_s" in r:
            cpu = walls.setdefault(r.get("cpu", "unrecorded"), {})
            cpu.setdefault(r["impl"], []).append(r["wall_s"])
    return {
        cpu: float(np.mean(impls["ours"]) / np.mean(impls["official"]))
        for cpu, impls in sorted(walls.items())
        if {"ours", "official"} <= set(impls)
    }


def binned(curve: list[list[float]], width: int = 1000) -> np.ndarray:
    """``[step, mean return]`` per ``width`` env steps (episodes of 16 envs end together:
    one point per wave), weighted by the episodes of each row."""
    bins: dict[int, list[float]] = {}
    for step, ret, n in curve:
        total = bins.setdefault(int(step) // width, [0.0, 0.0, 0.0])
        total[0] += step * n
        total[1] += ret * n
        total[2] += n
    rows = [[step / n, ret / n] for step, ret, n in (bins[key] for key in sorted(bins))]
    return np.array(rows).reshape(-1, 2)


def plot(task: str, runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    reference = SCORES["dmc_proprio"]
    if task in reference["curves"]:
        grid, seeds = np.array(reference["steps"]), np.array(reference["curves"][task])
        shown = grid <= max((r["steps"] for r in runs.values()), default=grid[-1]) * 1.05
        axis.plot(grid[shown], seeds.mean(0)[shown], "k--", lw=1.5, label="official score file")
        axis.fill_between(
            grid[shown], seeds.min(0)[shown], seeds.max(0)[shown], color="k", alpha=0.08
        )
    colors = {"ours": "tab:blue", "official": "tab:orange"}
    for name, record in sorted(runs.items()):
        curve = binned(record["training_returns"])
        if len(curve):
            axis.plot(curve[:, 0], curve[:, 1], "o-", ms=3, lw=1, color=colors[record["impl"]],
                      alpha=0.8, label=name)  # fmt: skip
        evals = np.array(record["eval_returns"] or np.zeros((0, 2)))
        if len(evals):
            axis.plot(evals[:, 0], evals[:, 1], "x:", color=colors[record["impl"]], alpha=0.6,
                      label=f"{name} greedy eval")  # fmt: skip
    axis.set_xlabel("env steps")
    axis.set_ylabel("training-episode return")
    axis.set_title(f"DMC {task}, {PRESET}; score file: its own protocol", fontsize=10)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="a DMC proprio task, e.g. cartpole_balance")
    parser.add_argument("--impls", nargs="+", default=list(IMPLS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, help="env steps (default: the preset's run.steps)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once")
    parser.add_argument("--reuse", action="store_true", help="record finished runs, train none")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "peers", help="run dirs")
    parser.add_argument("--results", type=Path, default=RESULTS, help="JSON and PNG folder")
    args = parser.parse_args(argv)
    try:
        known = ", ".join(SCORES["dmc_proprio"]["table_500k"]["scores"])
        if args.task not in SCORES["dmc_proprio"]["table_500k"]["scores"]:
            raise ConfigError(f"--task: no DMC proprio task {args.task!r}; known: {known}")
        unknown = sorted(set(args.impls) - set(IMPLS))
        if unknown:
            raise ConfigError(f"--impls: unknown {', '.join(unknown)}; known: {', '.join(IMPLS)}")
        if "official" in args.impls and not args.reuse:
            official_source()
            if ctypes.util.find_library("OSMesa") is None:
                # its DMC env renders a 64 x 64 'log/image' every step, proprio runs too
                raise ConfigError(
                    "official: its DMC env renders every step and needs MuJoCo's CPU "
                    "renderer: install Debian's libosmesa6 (make osmesa)"
                )
        steps = args.steps or load([PRESET]).run.steps
    except ConfigError as error:
        print(f"learn.py: {error}", file=sys.stderr)
        return 2
    path = args.results / f"peers_learn_{args.task}.json"
    result = json.loads(path.read_text()) if path.exists() else {"task": args.task, "runs": {}}
    jobs = [(impl, seed) for impl in args.impls for seed in args.seeds]
    with concurrent.futures.ThreadPoolExecutor(max(args.parallel, 1)) as pool:
        futures = [pool.submit(run, i, args.task, s, steps, args.runs, args.reuse) for i, s in jobs]
        for record in (f.result() for f in concurrent.futures.as_completed(futures)):
            if record is not None:
                result["runs"][f"{record['impl']}-seed{record['seed']}"] = record
    result |= {"preset": PRESET, "parallel": args.parallel}
    result["summary"] = summary(result["runs"], steps)
    args.results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    plot(args.task, result["runs"], path.with_suffix(".png"))
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
