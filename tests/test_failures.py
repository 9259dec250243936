"""Failures inside a run: envs that raise, an env worker killed with SIGKILL."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.runs import read_metrics

ROOT = Path(__file__).resolve().parent.parent
FAULTY = ["env=gym", "env.id=tests.faulty_env:Faulty-v0", "env.length=0"]


def test_failing_envs_and_a_killed_worker_do_not_end_the_run(tmp_path):
    logdir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "dreamer.train",
        "experiment=smoke",
        *FAULTY,
        "run.steps=1000",
        "run.train_ratio=4",  # few updates: this test is about collection
        "run.train_starts=200",
        "run.log_every=100",
        f"run.logdir={logdir}",
        "run.progress=false",
    ]
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while not (logdir / "metrics.jsonl").exists() or not read_metrics(logdir):
        assert process.poll() is None, "".join(lines)[-4000:]
        assert time.monotonic() < deadline, "no metrics in 5 minutes"
        time.sleep(0.5)
    announced = [line for line in lines if "env worker pids:" in line]
    victim = int(announced[0].split("env worker pids:")[1].split()[0])
    os.kill(victim, signal.SIGKILL)
    assert process.wait(timeout=600) == 0, "".join(lines)[-4000:]
    reader.join(10)
    stderr = "".join(lines)
    assert sum("replacing the collector" in line for line in lines) == 1, stderr[-4000:]
    env_failures = len(re.findall(r"injected failure", stderr))
    assert env_failures >= 2  # each Faulty-v0 instance raises every 150 steps
    rows = read_metrics(logdir)
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 1000
    # the replaced collector counts once; env failures count when their step arrives
    assert 2 <= rows[-1]["env/restarts"] <= env_failures + 1
    assert rows[-1]["updates"] > 0
    assert not Path(f"/proc/{victim}").exists()
