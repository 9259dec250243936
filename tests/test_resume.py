"""Runs survive: resume, config checks on resume, the run-directory lock, signals."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dreamer.outputs.logs import MetricsWriter
from dreamer.runtime import checkpoint
from dreamer.runtime.lock import RunLock, RunLockedError
from dreamer.serving.policy import Policy
from tests.runs import (
    QUICK,
    flip_a_tensor_byte,
    forked_runs,
    read_metrics,
    run_module,
    run_trainer,
)

FAST = QUICK
RATIO = int(dict(override.split("=") for override in QUICK)["run.train_ratio"])


def train(logdir: Path, *overrides: str, timeout: float = 300, preexec_fn=None):
    return run_trainer(logdir, *FAST, *overrides, timeout=timeout, preexec_fn=preexec_fn)


@pytest.mark.slow
def test_rerun_resumes_counters_metrics_and_update_schedule(finished_run, tmp_path):
    logdir = tmp_path / "run"
    shutil.copytree(finished_run, logdir)  # 300 steps done
    updates_before = checkpoint.load(checkpoint.latest(logdir))["learner"]["updates"]
    second = train(logdir, "run.steps=600")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from checkpoint-000000000300.pt at env step 300" in second.stderr
    steps = [row["env_steps"] for row in read_metrics(logdir)]
    assert steps == sorted(set(steps)) and steps[-1] == 600
    state = checkpoint.load(checkpoint.latest(logdir))
    assert state["steps"]["env_steps"] == 600
    # 4 x 16 batches: RATIO / 64 updates per env step, no catch-up burst
    resumed_updates = state["learner"]["updates"] - updates_before
    expected = RATIO / (4 * 16) * 300
    assert expected - 2 <= resumed_updates <= expected + 1, resumed_updates
    assert train(logdir, "run.steps=600").returncode == 0, "a finished run reruns as a no-op"
    assert checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"] == 600


def test_locked_run_directory_exits_2_naming_the_holder(tmp_path):
    logdir = tmp_path / "run"
    logdir.mkdir()
    with RunLock(logdir):
        result = train(logdir, "run.steps=300", timeout=60)
    assert result.returncode == 2
    assert f"pid {os.getpid()}" in result.stderr.strip().splitlines()[-1]


def test_lock_of_a_killed_process_does_not_block_the_next_run(tmp_path):
    logdir = tmp_path / "run"
    logdir.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from dreamer.runtime.lock import RunLock\n"
            "with RunLock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)",
            str(logdir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunLockedError), RunLock(logdir):
        pass
    holder.kill()
    holder.wait()
    assert (logdir / "run.lock.owner").exists(), "the killed holder left its files behind"
    with RunLock(logdir):
        pass


def test_metrics_past_the_checkpoint_and_torn_lines_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"env_steps": step}) + "\n" for step in (100, 200, 300, 400)]
    path.write_text("".join(rows) + '{"env_steps": 50')
    MetricsWriter.truncate(tmp_path, 200)
    assert [json.loads(line)["env_steps"] for line in path.read_text().splitlines()] == [100, 200]


BAD_RESUMES = [
    ("model.deter=128", "model.deter"),
    ("model=size1m", "model: cannot change on resume of"),  # the group the user typed
    ("env=cartpole", "holds an env=cue run, not env=cartpole"),
    ("replay.batch=8", "replay.batch"),
    ("replay.length=8", "replay.length"),
    ("replay.storage=disk", "replay.storage"),
    ("run.envs=3", "run.envs"),
    ("run.seed=5", "run.seed"),
    ("run.train_ratio=8", "run.train_ratio"),
    ("learner.lr=0.001", "learner.lr"),
    ("learner.horizon=4", "learner.horizon"),
    ("collector.chunk=8", "collector.chunk"),
]
BAD_STARTS = [  # refused by the trainer itself, after the command line parsed
    ("env=gym env.id=tests.faulty_env:Broken-v0 env.length=0", "env: cannot create"),
    ("env=gym env.id=tests.faulty_env:Nope-v0 env.length=0", "env.id: unknown gymnasium id"),
    ("env=gym env.id=no_such_module:Nope-v0 env.length=0", "env.id: cannot import"),
]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.name.startswith("run.lock")
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("finished") / "run"
    result = train(logdir, "run.steps=300")
    assert result.returncode == 0, result.stderr[-3000:]
    return logdir


@pytest.mark.slow
def test_bad_resumes_and_starts_exit_2_and_change_nothing(finished_run, tmp_path):
    """Each refused command: exit 2, one line naming the key; a resumed run directory is
    left byte for byte as it was, a new one is not created."""
    cases, rows = [], []
    for index, (override, key) in enumerate(BAD_RESUMES + BAD_STARTS):
        logdir = tmp_path / f"case{index}"
        if (override, key) in BAD_RESUMES:
            shutil.copytree(finished_run, logdir)
        cases.append((logdir, key, snapshot(logdir) if logdir.exists() else None))
        argv = [*FAST, "run.steps=300", *override.split()]
        rows.append(([*argv, f"run.logdir={logdir}", "run.progress=false"], []))
    out = tmp_path / "out"
    out.mkdir()
    # each a process of its own, forked from one interpreter that imported the trainer
    for (logdir, key, before), done in zip(cases, forked_runs("dreamer.train", rows, out)):
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert done.returncode == 2, done.stderr[-2000:]
        assert len(errors) == 1 and key in errors[0], done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        if before is None:
            assert not logdir.exists(), f"{logdir.name}: half-created run directory left"
        else:
            assert str(logdir) in errors[0], errors[0]  # the folder it looked at
            assert snapshot(logdir) == before, f"{logdir.name}: run directory changed"


class RunsCode:
    """Unpickling this touches ``marker``: what a shared checkpoint could do if loaded
    with ``weights_only=False``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_damaged_checkpoint_files_are_refused_in_one_line(finished_run, tmp_path):
    good = checkpoint.latest(finished_run)
    assert checkpoint.load(good)["format"] == checkpoint.FORMAT
    flipped, cut = tmp_path / "flipped.pt", tmp_path / "cut.pt"
    shutil.copy(good, flipped)
    flip_a_tensor_byte(flipped)
    cut.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])
    for path, reason in ((flipped, "does not match its checksum"), (cut, "not a readable")):
        with pytest.raises(checkpoint.CheckpointError, match=reason) as error:
            Policy.load(path)
        assert str(path) in str(error.value) and "\n" not in str(error.value)
    result = run_module("dreamer.evaluate", str(finished_run), f"eval.checkpoint={flipped}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {flipped}: damaged: its content does not match its checksum"
    ]


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_whole_one(finished_run, tmp_path):
    logdir = tmp_path / "run"
    shutil.copytree(finished_run, logdir)  # 300 steps done
    assert train(logdir, "run.steps=600").returncode == 0
    older, newest = sorted((logdir / "checkpoints").glob("checkpoint-*.pt"))
    flip_a_tensor_byte(newest)
    resumed = train(logdir, "run.steps=700")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    warnings = [line for line in resumed.stderr.splitlines() if f"skipped {newest.name}" in line]
    assert len(warnings) == 1 and f"resuming from {older.name}" in warnings[0], warnings
    assert "at env step 300" in resumed.stderr
    assert newest.with_name(newest.name + checkpoint.DAMAGED_SUFFIX).exists()
    steps = [row["env_steps"] for row in read_metrics(logdir)]
    assert steps == sorted(set(steps)) and steps[-1] == 700, steps  # none duplicated
    assert max(b - a for a, b in zip([0, *steps], steps)) < 200, steps  # none missing
    assert checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"] == 700


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(finished_run, tmp_path):
    marker = tmp_path / "ran"
    evil = tmp_path / "shared.pt"
    state = checkpoint.load(checkpoint.latest(finished_run)) | {"extra": RunsCode(marker)}
    torch.save(state, evil)
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="would run code"):
        Policy.load(evil)
    resumed = tmp_path / "resumed"
    shutil.copytree(finished_run, resumed)
    shutil.copy(evil, resumed / "checkpoints" / "checkpoint-000000000400.pt")
    before = snapshot(resumed)
    started = tmp_path / "started"
    runs = forked_runs(
        "dreamer.train",
        [
            ([*FAST, "run.steps=600", f"run.logdir={resumed}", "run.progress=false"], []),
            ([*FAST, "run.steps=600", f"run.logdir={started}", f"run.from_checkpoint={evil}"], []),
        ],
        tmp_path,
    )
    runs.append(run_module("dreamer.evaluate", str(finished_run), f"eval.checkpoint={evil}"))
    runs.append(run_module("dreamer.export", str(finished_run), f"export.checkpoint={evil}"))
    for done in runs:
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert done.returncode == 2, done.stderr[-2000:]
        assert len(errors) == 1 and "would run code" in errors[0], done.stderr[-2000:]
        assert "Traceback" not in done.stderr
    assert not marker.exists(), "loading ran the file's code"
    assert snapshot(resumed) == before and not started.exists()
