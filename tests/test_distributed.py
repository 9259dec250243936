"""Data-parallel training on the CPU: real torchrun, real gloo process groups."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from dreamer.command_line import load
from dreamer.runtime import checkpoint
from tests import ddp_updates
from tests.runs import read_metrics, run_module

ROOT = Path(__file__).resolve().parent.parent


def torchrun(ranks: int, *args: str, timeout: float = 600, **env) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc_per_node={ranks}", *args]
    return subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def updates(out: Path, ranks: int, batch: int, count: int, *flags: str) -> list[dict]:
    """Run tests/ddp_updates.py; every rank's final learner state."""
    args = ["-m", "tests.ddp_updates", str(out), f"--batch={batch}", f"--updates={count}"]
    result = torchrun(ranks, *args, *flags, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [torch.load(out / f"rank{rank}.pt") for rank in range(ranks)]


def floating(state: dict) -> dict:
    return {k: v for k, v in state.items() if v.is_floating_point()}


@pytest.mark.distributed
def test_two_ranks_of_batch_b_hold_identical_weights_equal_to_one_rank_of_batch_2b(tmp_path):
    """Each rank trains on its own rows, and after the updates both hold bit-identical
    weights and buffers (gradients averaged, the same optimizer steps), which match one
    rank that trained on both ranks' rows at once (the same fixed draws on every row)."""
    split0, split1 = updates(tmp_path / "two", 2, 4, 5, "--same-draws")
    # the reference in this process, no process group: one fresh interpreter fewer
    ddp_updates.main([str(tmp_path / "one"), "--batch=8", "--updates=5", "--same-draws"])
    whole = torch.load(tmp_path / "one" / "rank0.pt")
    assert not torch.equal(split0["batch"], split1["batch"])  # each rank trained on its own rows
    assert split0["loss"].keys() == split1["loss"].keys()
    for key, value in split0["loss"].items():
        assert torch.equal(value, split1["loss"][key]), key
    initial = floating(torch.load(tmp_path / "two" / "initial.pt"))
    changed = [k for k, v in initial.items() if not torch.equal(v, split0["loss"][k])]
    assert len(changed) > len(initial) // 2  # the updates trained the networks
    moved = max((split0["loss"][k] - v).abs().max() for k, v in initial.items())
    assert moved > 1e-5  # the comparison below is not between untrained weights
    for key in initial:
        torch.testing.assert_close(split0["loss"][key], whole["loss"][key], rtol=1e-5, atol=1e-6)


@pytest.mark.distributed
def test_torchrun_smoke_run_writes_one_metrics_file_and_one_checkpoint(tmp_path):
    logdir = tmp_path / "run"
    overrides = ["experiment=smoke", "run.steps=320", "eval.every=320", "run.progress=false"]
    overrides.append("run.train_ratio=4")  # ~16 updates: the job is under test, not learning
    result = torchrun(2, "-m", "dreamer.train", *overrides, f"run.logdir={logdir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.relative_to(logdir) for p in logdir.rglob("metrics.jsonl")] == [Path("metrics.jsonl")]
    [saved] = (logdir / "checkpoints").glob("*.pt")
    # only rank 0 checkpoints, so only its replay shard keeps files (chunks, tails)
    replay_files = list((logdir / "replay").rglob("*.pt"))
    assert replay_files and all(p.relative_to(logdir).parts[1] == "rank0" for p in replay_files)
    rows = read_metrics(logdir)
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(set(steps)), "another rank wrote metrics too"
    cfg = yaml.safe_load((logdir / "config.yaml").read_text())
    run, replay = cfg["run"], cfg["replay"]
    assert steps[-1] >= run["steps"]
    # env steps count both ranks' workers (rank 0's replay shard holds its own only);
    # the schedule uses the job's batch
    state = checkpoint.load(saved)
    assert state["steps"]["env_steps"] == steps[-1] > int(state["replay"]["written"].sum()) > 0
    expected = (steps[-1] - run["train_starts"]) * run["train_ratio"]
    expected /= replay["batch"] * replay["length"]
    assert abs(rows[-1]["updates"] - expected) <= 0.1 * expected + 2
    assert state["learner"]["updates"] == rows[-1]["updates"]
    evals = read_metrics(logdir, "eval")  # rank 0 alone evaluates
    assert [row["env_steps"] for row in evals] == sorted({row["env_steps"] for row in evals})
    assert len(evals) == len(list((logdir / "eval").iterdir())) >= 1
    assert "INFO [rank 1]" not in result.stderr  # other ranks log warnings only
    # standalone evaluation with reports rebuilds rank 0's replay shard from the checkpoint
    evaluated = run_module(
        "dreamer.evaluate",
        f"run.logdir={logdir}",
        "eval.episodes=1",
        "eval.max_steps=20",
        "eval.render_workers=0",
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert (logdir / "evaluate" / f"{steps[-1]:012d}" / "open_loop.png").exists()


@pytest.mark.distributed
def test_a_failing_rank_ends_the_job_with_its_message(tmp_path):
    started = time.monotonic()
    result = torchrun(
        2,
        "-m",
        "dreamer.train",
        "experiment=smoke",
        "env=gym",
        "env.id=tests.faulty_env:RankFault-v0",
        "env.length=0",
        "learner.dist_timeout=120",
        f"run.logdir={tmp_path / 'run'}",
        "run.progress=false",
        timeout=400,
    )
    assert result.returncode != 0
    assert time.monotonic() - started < 300
    assert "error: rank 1: collection failed" in result.stderr
    assert "the simulator on rank 1 is gone" in result.stderr
    assert "Root Cause" in result.stderr and "rank      : 1" in result.stderr  # torchrun's summary


@pytest.mark.parametrize(
    ("ranks", "overrides", "message"),
    [
        (3, ["experiment=smoke"], "run.envs: split evenly across the 3 ranks"),
        (2, ["experiment=smoke", "replay.batch=5"], "replay.batch: split evenly across the 2"),
    ],
)
def test_a_job_total_that_does_not_split_across_ranks_exits_2(ranks, overrides, message):
    result = subprocess.run(
        [sys.executable, "-m", "dreamer.train", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WORLD_SIZE": str(ranks)},
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {message}") and result.stderr.count("\n") == 1


def test_the_4gpu_preset_composes_on_a_cpu_and_is_refused_for_training_here():
    shown = subprocess.run(
        [sys.executable, "-m", "dreamer.train", "experiment=minedojo_4gpu", "--cfg", "job"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WORLD_SIZE": "4"},
    )
    assert shown.returncode == 0, shown.stderr
    printed = yaml.safe_load(shown.stdout)
    assert printed["run"].pop("logdir")
    loaded = OmegaConf.to_container(load(["experiment=minedojo_4gpu"]))
    del loaded["run"]["logdir"]
    assert printed == loaded  # the job's totals, as the preset gives them
    if torch.cuda.is_available():
        return
    for env in ("env=minedojo", "env=crafter"):  # the env's check comes first, then the GPU's
        refused = subprocess.run(
            [sys.executable, "-m", "dreamer.train", "experiment=minedojo_4gpu", env],
            capture_output=True,
            text=True,
            timeout=120,
        )
        missing = (
            "env: minedojo needs minedojo" if env == "env=minedojo" else "learner.device: cuda"
        )
        if env == "env=minedojo" and importlib.util.find_spec("minedojo"):
            continue
        assert refused.returncode == 2 and refused.stderr.startswith(f"error: {missing}")
        assert refused.stderr.count("\n") == 1
