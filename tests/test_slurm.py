"""The SLURM batch scripts on a real one-node SLURM cluster (slurmctld + slurmd + munge,
started for these tests by tests/slurm_cluster.sh and stopped by pid afterwards).

If the cluster cannot start, these tests fail with the daemon logs: never skipped.
"""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dreamer.runtime import checkpoint, signals
from tests.runs import QUICK, UNTIL_STOPPED, ignores_usr1, read_metrics, training

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "tests" / "slurm_cluster.sh"
pytestmark = pytest.mark.slurm

# the cue task: what these tests check is the job, not the env
SMOKE = [*QUICK, "eval.every=0", "run.progress=false"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment that reaches the test cluster (SLURM_CONF)."""
    directory = tmp_path_factory.mktemp("slurm")
    try:
        up = subprocess.run(
            ["bash", str(CLUSTER), "up", str(directory)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if up.returncode != 0:
            pytest.fail(f"the SLURM test cluster did not start:\n{up.stdout}\n{up.stderr}")
        yield {**os.environ, "SLURM_CONF": up.stdout.strip().splitlines()[-1]}
    finally:
        subprocess.run(["bash", str(CLUSTER), "down", str(directory)], timeout=60)


def submit(slurm: dict, logdir: Path, *overrides: str) -> str:
    """``sbatch slurm/dreamer-cpu.sbatch``; SLURM's own output file (only what the job
    prints before it redirects into the run directory) next to the run, not in the repo."""
    output = f"--output={logdir.parent}/slurm-%j.out"
    result = subprocess.run(
        ["sbatch", "--parsable", output, "slurm/dreamer-cpu.sbatch", *overrides],
        cwd=ROOT,
        env=slurm,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def job(slurm: dict, job_id: str) -> dict[str, str]:
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id],
        env=slurm,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))


def wait_until_done(slurm: dict, job_id: str, logdir: Path, timeout: float = 400) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job(slurm, job_id)
        if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return state
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=slurm, timeout=30)
    output = logdir / f"slurm-{job_id}.out"
    pytest.fail(f"job {job_id} not done in {timeout} s:\n{output.read_text()[-3000:]}")


def crash(job_id: str) -> None:
    """SIGKILL every process of the job (on the cluster's only node): a crash. A cancel
    would not do: ``scancel`` sends SIGTERM first, which the job script takes for a
    preemption (a checkpoint and a requeue) once the trainer handles it."""
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if f"SLURM_JOB_ID={job_id}".encode() in environ.read_bytes().split(b"\0"):
                os.kill(int(environ.parent.name), signal.SIGKILL)


def test_preemptions_before_and_right_after_a_worker_replacement_checkpoint_and_requeue(
    slurm, tmp_path
):
    """slurm/dreamer-cpu.sbatch end to end, preempted twice: USR1 (what SLURM sends
    ahead of a time limit or preemption) to the first run, and to the resumed run right
    after a killed env worker's collector was replaced. USR1 reaches every process of
    the job step, so the replacement's workers must ignore it as the first ones do, or
    it kills them before the checkpoint. Each stop checkpoints and requeues.

    The job trains with no step limit, so no machine is fast enough to finish it before
    the test has preempted it twice; once the third run resumed, the job crashes (every
    process of it SIGKILLed) and a second job on the same run directory finishes the run with
    a metrics row every log interval and nothing duplicated."""
    logdir = tmp_path / "run"
    job_id = submit(slurm, logdir, *SMOKE, UNTIL_STOPPED, f"run.logdir={logdir}")
    output = logdir / f"slurm-{job_id}.out"

    def wait_for(pattern: str, count: int = 1) -> str:
        deadline = time.monotonic() + 300
        while (
            len(found := re.findall(pattern, output.read_text() if output.exists() else "")) < count
        ):
            assert time.monotonic() < deadline, output.read_text()[-3000:]
            time.sleep(0.2)
        return found[count - 1]

    def preempt() -> None:
        subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], env=slurm, check=True)

    try:
        deadline = time.monotonic() + 300  # training under way: a row after an update
        while not training(read_metrics(logdir, live=True)):
            assert time.monotonic() < deadline, output.read_text()[-3000:]
            time.sleep(0.2)
        preempt()
        wait_for("SLURM_RESTART_COUNT=1")
        victim = int(wait_for(r"env worker pids: (\d+)", 2))  # the resumed run's first workers
        os.kill(victim, signal.SIGKILL)  # the test runs on the cluster's only node
        replacements = wait_for(r"env worker pids: ([\d ]+)", 3).split()  # delivering now
        # USR1 kills a worker that neither ignores nor blocks it; the driver stops at its
        # next check and might not see that death, so look at the workers themselves
        for pid in replacements:
            assert ignores_usr1(int(pid)), f"worker {pid} would die of USR1"
        preempt()
        wait_for("SLURM_RESTART_COUNT=2")
        wait_for(r"resuming from checkpoint", 2)  # the third run is training
    finally:  # a job left running would outlive this test's cluster
        crash(job_id)
        subprocess.run(["scancel", "--signal=KILL", "--full", job_id], env=slurm, timeout=30)
    assert wait_until_done(slurm, job_id, logdir)["Restarts"] == "2"
    text = output.read_text()
    runs = text.split("SLURM_RESTART_COUNT=")
    assert [run.split()[0] for run in runs[1:]] == ["unset", "1", "2"]
    stops = [
        int(found)
        for found in re.findall(r"stopped by signal 10 at env step (\d+); requeueing", text)
    ]
    assert len(stops) == 2 and 0 < stops[0] < stops[1], text[-3000:]
    for run, step in zip(runs[2:], stops):
        assert (checkpoint.checkpoint_dir(logdir) / f"checkpoint-{step:012d}.pt").exists()
        assert f"resuming from checkpoint-{step:012d}.pt at env step {step}" in run
    assert runs[2].count("replacing the collector") == 1, runs[2][-3000:]  # none died of USR1
    assert "replacing the collector" not in runs[1] + runs[3]

    end = stops[1] + 300
    last_job = submit(slurm, logdir, *SMOKE, f"run.steps={end}", f"run.logdir={logdir}")
    state = wait_until_done(slurm, last_job, logdir, timeout=600)
    last = (logdir / f"slurm-{last_job}.out").read_text()
    assert state["JobState"] == "COMPLETED" and last.count("trainer exit code 0") == 1, last
    assert "resuming from checkpoint" in last
    steps = [row["env_steps"] for row in read_metrics(logdir)]
    assert steps == sorted(set(steps)) and steps[-1] >= end
    gaps = [after - before for before, after in zip([0, *steps], steps)]
    assert max(gaps) < 2 * 100, gaps  # a row every log interval (100)
    assert checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"] == steps[-1]
    assert not (logdir / signals.STOPPED_FILE).exists()


def test_sweep_submits_one_slurm_job_per_combination(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    overrides = ["experiment=smoke", "env=cue", "run.steps=200", "run.train_starts=100"]
    overrides += ["eval.every=0", "run.progress=false", "run.seed=0,1", "run.train_ratio=4"]
    result = subprocess.run(
        [sys.executable, "-m", "dreamer.train", "-m", "hydra/launcher=slurm", *overrides]
        + [f"hydra.sweep.dir={sweep}"],
        cwd=ROOT,
        env=slurm,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [path for path in (sweep / ".submitit").iterdir() if re.fullmatch(r"\d+_\d", path.name)]
    assert len(jobs) == 2  # one SLURM array task (with submitit's logs) per seed
    for number, seed in ((0, 0), (1, 1)):
        logdir = sweep / str(number)
        saved = yaml.safe_load((logdir / "config.yaml").read_text())
        assert saved["run"]["seed"] == seed and saved["env"]["name"] == "cue"
        assert checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"] >= 200
