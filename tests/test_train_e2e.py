"""End to end: the real trainer, real env worker processes, real files."""

import gc
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from PIL import Image

from dreamer.envs.crafter import ACHIEVEMENTS
from dreamer.outputs import metric_keys
from dreamer.runtime import checkpoint
from dreamer.runtime.signals import REQUEUE_EXIT
from dreamer.train import main
from tests.runs import (
    QUICK,
    ROOT,
    UNTIL_STOPPED,
    Trainer,
    all_gone,
    parent,
    read_metrics,
    run_module,
    run_trainer,
    wait_until,
)

sys.path.insert(0, str(ROOT / "benchmarks"))
import gc_freeze  # noqa: E402

LOSS_TERMS = ("loss_model_reco", "loss_model_reward", "loss_actor", "loss_value")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """``make smoke``'s run on Crafter (``python -m dreamer.train experiment=smoke``), at
    under a third of its length and half its train ratio (its updates are most of its
    CPU): two evaluations, ~70 updates, a few random-policy episodes (~120-230 steps
    each, 320 steps per env)."""
    logdir = tmp_path_factory.mktemp("smoke") / "run"
    overrides = ("run.steps=640", "run.train_ratio=8", "eval.every=320")
    result = run_trainer(logdir, "experiment=smoke", *overrides)
    assert result.returncode == 0, result.stderr[-4000:]
    return logdir, result


@pytest.mark.slow
def test_smoke_reaches_steps_and_writes_every_output(smoke_run):
    logdir, result = smoke_run
    saved = yaml.safe_load((logdir / "config.yaml").read_text())
    assert saved["env"]["name"] == "crafter" and saved["model"]["name"] == "tiny"
    rows = read_metrics(logdir)
    assert rows[-1]["env_steps"] == saved["run"]["steps"]
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(set(steps)), "env_steps must be strictly increasing"
    for key in ("updates", "env_steps_per_s", "updates_per_s", "policy_version", *LOSS_TERMS):
        assert key in rows[-1], key
    finished = [row for row in rows if "episode/return" in row]
    assert finished, "no Crafter episode finished"
    assert all(f"achievements/{name}" in finished[0] for name in ACHIEVEMENTS)
    assert finished[0]["episode/length"] > 0
    assert list((logdir / "tensorboard").glob("events.out.tfevents.*"))
    assert "ProcessSlotTransport" in result.stderr, "the process-slot transport was not used"
    assert "no GPU: a learner update takes" in result.stderr, "no measured CPU speed note"
    # the start line says how the update runs, and why that precision
    assert re.search(
        r"training tiny on crafter \(update: fp32 \(auto: [^)]+\), eager;", result.stderr
    )
    noise = [line for line in result.stderr.splitlines() if re.search(r"WARN|ERROR|Trace", line)]
    assert not noise, noise  # a normal end of every process of the run is quiet


@pytest.mark.slow
def test_smoke_runs_updates_at_the_configured_ratio(smoke_run):
    logdir, _ = smoke_run
    saved = yaml.safe_load((logdir / "config.yaml").read_text())
    run, replay = saved["run"], saved["replay"]
    per_step = run["train_ratio"] / (replay["batch"] * replay["length"])
    batch_frames = saved["collector"]["chunk"] * run["envs"]
    # the schedule starts at the first batch at or past train_starts (one update),
    # then owes per_step updates for every env step after it
    latest_start = run["train_starts"] + batch_frames
    low = 1 + int((run["steps"] - latest_start) * per_step) - 1
    high = 1 + int((run["steps"] - run["train_starts"]) * per_step)
    updates = read_metrics(logdir)[-1]["updates"]
    assert low <= updates <= high, (low, updates, high)
    state = checkpoint.load(checkpoint.latest(logdir))
    assert state["learner"]["updates"] == updates
    assert state["steps"]["env_steps"] == run["steps"]


@pytest.mark.slow
def test_heap_is_frozen_inside_the_loop_and_unfrozen_after_a_normal_exit(tmp_path):
    logdir = tmp_path / "run"
    main(
        [
            *QUICK,
            "run.steps=400",
            f"run.logdir={logdir}",
            "run.progress=false",
        ]
    )
    assert gc.get_freeze_count() == 0
    rows = read_metrics(logdir)
    assert all(row["gc/frozen_objects"] > 0 for row in rows)
    for previous, row in zip(rows, rows[1:]):  # running totals since the loop began
        seconds = [row[f"gc/gen{g}_seconds"] for g in range(3)]
        assert abs(sum(seconds) - row["gc/seconds"]) < 1e-9
        for g in range(3):
            before, after = previous[f"gc/gen{g}_collections"], row[f"gc/gen{g}_collections"]
            assert 0 <= before <= after
    assert rows[-1]["gc/gen0_collections"] > 0, "no collection was counted"


@pytest.mark.slow
def test_run_gc_freeze_false_leaves_the_heap_unfrozen_and_still_counts(tmp_path):
    logdir = tmp_path / "run"
    main(
        [
            *QUICK,
            "run.steps=300",
            "run.gc_freeze=false",
            f"run.logdir={logdir}",
            "run.progress=false",
        ]
    )
    rows = read_metrics(logdir)
    assert all(row["gc/frozen_objects"] == 0 for row in rows)
    assert rows[-1]["gc/gen0_collections"] > 0


def benchmark(script: str, *args: str) -> tuple[dict, str]:
    """``python benchmarks/<script> --quick ARGS --json``: its results and what it printed."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        done = subprocess.run(
            [sys.executable, f"benchmarks/{script}", "--quick", *args, "--json", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads(out.read_text()), done.stdout


@pytest.mark.slow
def test_the_gc_freeze_benchmark_measures_a_frozen_and_an_unfrozen_run(tmp_path, capsys):
    """benchmarks/gc_freeze.py --quick: a real run each way, their full collections'
    pauses and generation-2 collections from the runs' own metrics (its main here, its
    runs forked from the zygote as the suite's others)."""
    out = tmp_path / "result.json"

    def launch(arguments: list[str]) -> subprocess.CompletedProcess:
        return run_module("dreamer.train", *arguments, timeout=600)

    assert gc_freeze.main(["--quick", "env=cue", "--json", str(out)], launch) == 0
    result, printed = json.loads(out.read_text()), capsys.readouterr().out
    unfrozen, frozen = result["runs"]["unfrozen"], result["runs"]["frozen"]
    assert unfrozen["frozen_objects"] == 0 < frozen["frozen_objects"]
    assert unfrozen["full_collection_s"] > 0 and frozen["full_collection_s"] > 0
    assert all(way["gen2_longest_s"] >= 0 for way in (unfrozen, frozen))
    assert unfrozen["env_steps"] == frozen["env_steps"] == 300
    assert "(design: 0.208 s -> 0.025 s, 8.3x)" in printed


@pytest.mark.slow
def test_the_render_benchmark_draws_a_runs_reports_alike_serially_and_on_a_pool(smoke_run):
    """benchmarks/render.py --quick on this module's run: one evaluation's reports drawn
    serially and on a pool of 2, the same files byte for byte."""
    logdir, _ = smoke_run
    result, printed = benchmark("render.py", "--run", str(logdir))
    assert result["identical"] == {"2": True}
    assert result["kinds"] == ["bars", "curve", "open_loop", "video"]
    assert result["files"] == 4 and result["serial_s"] > 0 and result["pool_s"]["2"] > 0
    assert "a pool divides by min(workers, cores)" in printed
    assert not (logdir / "evaluate").exists()  # the run's folder is only read


@pytest.mark.slow
def test_heap_is_unfrozen_after_an_interrupt(tmp_path):
    logdir = tmp_path / "run"
    metrics = logdir / "metrics.jsonl"

    def interrupt_once_logging():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text()):
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)  # past the deadline too: the run never ends alone

    # a shell that starts this suite in the background ignores SIGINT; Ctrl-C in a
    # terminal raises KeyboardInterrupt, which is the behaviour under test
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_once_logging, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        main(
            [
                "experiment=smoke",
                "env=cue",
                UNTIL_STOPPED,  # Ctrl-C ends it
                "run.log_every=64",
                f"run.logdir={logdir}",
                "run.progress=false",
            ]
        )
    signal.signal(signal.SIGINT, previous)
    assert gc.get_freeze_count() == 0
    assert read_metrics(logdir)[0]["gc/frozen_objects"] > 0
    assert checkpoint.latest(logdir) is not None, "no checkpoint after Ctrl-C"


@pytest.mark.slow
def test_smoke_evaluates_periodically_and_writes_every_report(smoke_run):
    logdir, result = smoke_run
    saved = yaml.safe_load((logdir / "config.yaml").read_text())
    every, steps = saved["eval"]["every"], saved["run"]["steps"]
    evals = read_metrics(logdir, "eval")
    # each eval runs at the first batch at or past a multiple of eval.every
    batch_frames = saved["collector"]["chunk"] * saved["run"]["envs"]
    assert len(evals) == steps // every
    for index, row in enumerate(evals, 1):
        assert index * every <= row["env_steps"] < index * every + batch_frames
        assert row["eval/episodes"] == saved["eval"]["episodes"]
        assert 0 < row["eval/length"] <= saved["eval"]["max_steps"]
        assert all(0 <= row[f"eval/achievements/{name}"] <= 100 for name in ACHIEVEMENTS)
        assert row["eval/crafter_score"] >= 0 and math.isfinite(row["eval/return"])
    everything = read_metrics(logdir, "all")
    for position, row in enumerate(everything):
        if "eval/return" not in row:
            continue
        folder = logdir / "eval" / f"{row['env_steps']:012d}"
        written = {path.name for path in folder.iterdir()}
        assert written == {"episode.mp4", "open_loop.png", "returns.png", "achievements.png"}
        # the curve drawn at this eval has every train and eval point logged up to it (the
        # first eval may come before any training episode ended: no train curve then)
        before = everything[: position + 1]
        counts = {
            "train": sum("episode/return" in r for r in before),
            "eval": sum("eval/return" in r for r in before),
        }
        expected = {curve: count for curve, count in counts.items() if count}
        points = json.loads(Image.open(folder / "returns.png").text["Description"])
        assert points == expected
        assert_labelled(folder, row, before, saved)
    assert result.stderr.count("eval at env step") == len(evals)
    assert_documented(everything)


def assert_documented(rows: list[dict]) -> None:
    """Every key a run wrote is in docs/outputs.md's table (six were in no doc), under
    the names it gives (not torchrl's inside the loss)."""
    keys = {key for row in rows for key in row}
    assert [key for key in sorted(keys) if not metric_keys.documented(key)] == []
    assert not keys & set(metric_keys.LOGGED_AS)
    assert set(metric_keys.LOGGED_AS.values()) <= keys


def labels(png) -> list[str]:
    """Every text drawn on a report figure, as the file records it."""
    return json.loads(Image.open(png).text["Comment"])


def assert_labelled(folder, row: dict, before: list[dict], saved: dict) -> None:
    """A report's figures say what they show (they said "crafter" and "Crafter score
    0.0%" over bare bars and a bare dot): the env and the step, how many episodes are
    behind each line and bar, and the error row's colour scale."""
    step, episodes = row["env_steps"], saved["eval"]["episodes"]
    returns = labels(folder / "returns.png")
    evaluations = sum("eval/return" in r for r in before)
    train = sum(r.get("episode/count", 0) for r in before if "episode/return" in r)
    assert f"crafter: returns up to env step {step:,}" in returns
    # no train line (nor its legend) before the first training episode ends
    assert (f"train: {train:,} episodes, a point per log row (their mean)" in returns) == (
        train > 0
    )
    plural = "s" if evaluations > 1 else ""
    assert f"eval: {evaluations} evaluation{plural}, each the mean of {episodes} episodes" in (
        returns
    )
    achievements = labels(folder / "achievements.png")
    score = f"{row['eval/crafter_score']:.1f}%"
    assert f"Crafter score {score}: evaluation at env step {step:,}" in achievements
    assert f"% of the evaluation's {episodes} episodes with the achievement" in achievements
    rates = [row[f"eval/achievements/{name}"] for name in ACHIEVEMENTS]
    assert ("none yet" in achievements) == (not any(rates))
    assert "|truth - model|\n(mean of RGB)" in labels(folder / "open_loop.png")
    assert {"0", "100", "200"} <= set(labels(folder / "open_loop.png"))  # the scale's ticks


@pytest.mark.slow
def test_evaluate_writes_reports_for_the_latest_checkpoint(smoke_run, tmp_path):
    logdir = tmp_path / "run"
    shutil.copytree(smoke_run[0], logdir, ignore=shutil.ignore_patterns("eval"))
    arguments = ("eval.episodes=3", "eval.max_steps=40", "eval.render_workers=0")
    # dreamer.evaluate, and the parents of the processes it started
    result = run_module("tests.evaluate_watched", f"run.logdir={logdir}", *arguments)
    assert result.returncode == 0, result.stderr[-3000:]
    step = checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"]
    folder = logdir / "evaluate" / f"{step:012d}"  # beside training's eval/, not over it
    written = {path.name for path in folder.iterdir()}
    assert written == {"episode.mp4", "open_loop.png", "returns.png", "achievements.png"}
    assert not (logdir / "eval").exists()
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"eval return at env step {step}: mean ")
    assert lines[0].endswith(" over 3 episodes")
    assert lines[1].startswith("returns per episode: ") and len(lines[1].split()) == 3 + 3
    assert lines[2] == f"reports: {folder}"
    # the evaluation process forked from the command's forkserver (a spawned one imported
    # torch and torchrl anew: ~3 s before its first episode), which the command forked
    evaluation_parent, server, server_parent, command = lines[3].split()[1:]
    assert evaluation_parent == server and server_parent == command, lines[3]


def test_evaluate_without_a_checkpoint_exits_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "dreamer.evaluate", f"run.logdir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path}: no checkpoint in it (expected checkpoint-*.pt files)"
    ]


@pytest.mark.slow
def test_metrics_say_where_the_loop_time_goes(smoke_run):
    logdir, result = smoke_run
    rows = read_metrics(logdir)
    phases = ("collect_wait", "sample", "update", "sync", "log", "eval")
    for previous, row in zip(rows, rows[1:]):
        times = [row[f"time/{phase}_s"] for phase in phases]
        wall = (row["env_steps"] - previous["env_steps"]) / row["env_steps_per_s"]
        assert sum(times) <= wall * 1.02 + 0.05, (times, wall)  # phases never overlap
    assert sum(row["time/update_s"] for row in rows) > 0
    assert sum(row["time/collect_wait_s"] for row in rows) > 0
    # per update: the loop's wall beside the update's own time, in rows with updates
    for previous, row in zip(rows, rows[1:]):
        done = row["updates"] - previous["updates"]
        assert ("time/s_per_update" in row) == (done > 0), row
        if done > 0:
            assert row["time/s_per_update"] * done == pytest.approx(row["time/wall_s"])
            assert row["time/update_s_per_update"] * done == pytest.approx(row["time/update_s"])
            assert row["time/update_s_per_update"] <= row["time/s_per_update"]
    # each row says when its interval ended (tests/test_loop.py: the moment the row was
    # decided); Unix time, which a VM's clock may step: not set against time/wall_s
    stamps = [row["timestamp"] for row in rows]
    assert all(isinstance(stamp, float) for stamp in stamps) and stamps[-1] <= time.time()
    summary = [line for line in result.stderr.splitlines() if "loop time:" in line]
    assert len(summary) == 1 and all(f"{phase} " in summary[0] for phase in phases)


@pytest.mark.slow
def test_grouped_env_workers_train_with_pushes_to_a_server_thread(tmp_path):
    """``collector.envs_per_worker`` > 1: torchrl's workers are driver threads feeding an
    env pool of processes, and the policy is served from a driver thread. The run logs
    the pool's processes (it paces those), which fork from the run's forkserver (spawned,
    each imported torch and torchrl anew), pushes weights to the thread server and trains
    (it crashed at its first batch: a worker thread has no pid). A pool process that dies
    is replaced with its collector and the run goes on: torchrl sees a dead pool
    process only while its driver thread waits for results, not while that thread is
    blocked sending to it; a run then waited for ever, its own stop signals unseen.
    Killed once the run trains steadily, which left the thread blocked each time here."""
    logdir = tmp_path / "run"
    grouped = ("run.envs=4", "collector.envs_per_worker=2", "eval.every=0", UNTIL_STOPPED)
    trainer = Trainer(logdir, *QUICK, *grouped, log=tmp_path / "run.log")
    try:
        pool = [int(pid) for pid in trainer.wait_for(r"env worker pids: ([\d ]+)").split()]
        servers = {parent(pid) for pid in pool}  # read while the run cannot end
        drivers = {parent(server) for server in servers}
        pushed = wait_until(
            lambda: [r for r in read_metrics(logdir, live=True) if r.get("policy_version", 0) > 1],
            "a row after a weight push",
            running=trainer,
        )
        quiet = trainer.text()
        trainer.wait_rows(past=pushed[-1]["env_steps"] + 300)
        victim = pool[0]
        os.kill(victim, signal.SIGTERM)
        # a hang detector: the replacement takes seconds, without the watch for ever
        trainer.wait_for("replacing the collector", timeout=90)
        pool = [int(pid) for pid in trainer.wait_for(r"env worker pids: ([\d ]+)", 2).split()]
        replaced = read_metrics(logdir, live=True)[-1]["env_steps"]
        went_on = trainer.wait_rows(past=replaced + 200)
    finally:
        code = trainer.stop(timeout=120)  # a hung run ignores it: the test fails, not waits
    assert code == REQUEUE_EXIT, trainer.tail()
    # one forkserver, forked from the driver
    assert len(pool) == 2 and len(servers) == 1 and drivers == {trainer.pid}, (servers, drivers)
    assert pushed[-1]["updates"] > 0  # the pushes reached the served policy
    noise = [line for line in quiet.splitlines() if re.search(r"WARN|ERROR|Trace", line)]
    assert not noise, noise
    assert went_on[-1]["env/restarts"] == 1 and all_gone([victim], timeout=0) == []
