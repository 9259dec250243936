"""Each kind of child process of a run dies (SIGKILL), and the run goes on: a render
worker (its pool is replaced, figures drawn again byte for byte), the inference server
(its collector is replaced), the evaluation process (relaunched, the evaluation it was
running played again); then a process-group USR1 (what srun sends every process of a
SLURM step) after all those replacements still checkpoints the run, and no child dies
of it. Env worker deaths: tests/test_failures.py; the driver's: tests/test_kill.py; a
starved (stopped) inference server: tests/test_pace.py."""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from dreamer.evaluation.render import RenderPool, draw
from dreamer.runtime import checkpoint, signals
from tests.runs import (
    QUICK,
    UNTIL_STOPPED,
    Trainer,
    alive,
    all_gone,
    descendants,
    ignores_usr1,
    parent,
    read_metrics,
    wait_until,
)

EVERY = 300
RUN = [
    *QUICK,
    "run.save_every=1",
    "collector.sync_every=1",  # a push after every update
    f"eval.every={EVERY}",
    "eval.episodes=1",
    "eval.max_steps=100",
    "eval.render_workers=1",
    UNTIL_STOPPED,  # the test ends it with USR1
]


def test_render_workers_die_with_a_killed_run():
    """A run killed outright (SIGKILL, out of memory) cannot close its pool: its workers
    go with it (``die_with_parent``), as the forkserver and its children do."""
    owner = subprocess.Popen([sys.executable, "-c", POOL_OWNER], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in owner.stdout.readline().split()]
    assert len(workers) == 2 and all(alive(pid) for pid in workers)
    owner.kill()
    owner.wait()
    wait_until(lambda: not any(alive(pid) for pid in workers), "the workers' end", 30)


def test_a_child_whose_parent_went_first_dies_under_a_subreaper_too():
    """``die_with_parent`` called once the parent is gone kills the caller, also where a
    subreaper adopted it (systemd --user, tini, the tests' zygote), whose pid is not 1."""
    done = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == -signal.SIGKILL  # 0: it lived on


ORPHAN = """
import ctypes, os
from dreamer.runtime.signals import die_with_parent
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans below come here
release, hold = os.pipe()
told, tell = os.pipe()
if os.fork() == 0:  # the parent
    child = os.fork()
    if child == 0:
        os.read(release, 1)  # until its parent is gone
        die_with_parent()
        os._exit(0)
    os.write(tell, str(child).encode())
    os._exit(0)
child = int(os.read(told, 32))
os.wait()  # the parent's end: the child is this subreaper's now
os.write(hold, b"x")
_, status = os.waitpid(child, 0)
print(os.waitstatus_to_exitcode(status))
"""


POOL_OWNER = """
import time
from dreamer.evaluation.render import RenderPool
pool = RenderPool(2)
pool.start()
for future in pool._starting:
    future.result()
print(*pool._pool._processes, flush=True)
time.sleep(600)
"""


def test_render_pool_draws_again_what_a_killed_worker_left(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (300, 48, 48, 3), dtype=np.uint8)
    series = {"train": ([0.0, 1.0, 2.0], [0.0, 2.0, 1.0])}
    draw("video", tmp_path / "inline" / "episode", {"frames": frames})
    draw("curve", tmp_path / "inline" / "curve.png", {"series": series, "title": "t"})
    pool = RenderPool(1)
    pool.start()
    worker = next(iter(pool._pool._processes))
    pool.submit("video", tmp_path / "pool" / "episode", frames=frames)
    pool.submit("curve", tmp_path / "pool" / "curve.png", series=series, title="t")
    os.kill(worker, signal.SIGKILL)
    pool.close()
    assert pool.failures == []
    assert pool.relaunches.counts["render"] == 1
    inline = sorted(path.name for path in (tmp_path / "inline").iterdir())
    assert sorted(path.name for path in (tmp_path / "pool").iterdir()) == inline
    for name in inline:
        assert (tmp_path / "pool" / name).read_bytes() == (tmp_path / "inline" / name).read_bytes()
    assert not alive(worker)


@pytest.mark.slow
def test_children_die_and_the_run_goes_on(tmp_path):
    logdir = tmp_path / "run"
    # in a session of its own, USR1 ignored, as slurm/node.sh starts it
    run = Trainer(logdir, *RUN, log=tmp_path / "run.log", session=True, ignore_usr1=True)
    # a render worker (started with the first evaluation), forked from the run's
    # forkserver as the env workers are (not a new interpreter), killed: a new pool
    render = int(run.wait_for(r"render worker pids: (\d+)"))
    forkserver = parent(int(run.wait_for(r"env worker pids: (\d+)")))
    assert parent(render) == forkserver != run.pid
    os.kill(render, signal.SIGKILL)
    # the inference server, killed: a new collector with a new server
    os.kill(int(run.wait_for(r"inference server pid: (\d+)")), signal.SIGKILL)
    run.wait_for(r"inference server pid: (\d+)", 2)
    assert "after its inference server died; replacing the collector" in run.text()
    run.wait_for(r"render worker pids: (\d+)", 2)
    # the new server serves the learner's pushes (a push to a stopped server, timed out:
    # tests/test_pace.py, where the moment of the stop can be chosen)
    rows = run.wait_updates()
    version_at_replacement = run.wait_rows(past=rows[-1]["env_steps"])[-1]["policy_version"]
    # the evaluation process, killed as soon as it shows (most likely mid-evaluation)
    os.kill(int(run.wait_for(r"evaluation process pid: (\d+)")), signal.SIGKILL)
    run.wait_for(r"(the evaluation process .*died.*; replacing it)")
    run.wait_for(r"(eval at env step \d+: return)")  # the one it ran, played again
    run.wait_for(r"evaluation process pid: (\d+)", 2)
    # the new server took pushes since (the rows are the run's own record of them)
    wait_until(
        lambda: read_metrics(logdir, live=True)[-1]["policy_version"] > version_at_replacement,
        "a row with a newer policy version",
        running=run,
    )
    # every replacement in place: each child ignores (or blocks) USR1 as the launcher
    # made the run ignore it, and a preemption reaching every process of the session
    # stops the run with a checkpoint and kills none of them
    replaced = descendants(run.pid)
    assert {pid: ignores_usr1(pid) for pid in replaced} == dict.fromkeys(replaced, True)
    before_the_stop = len(run.text())
    os.killpg(run.pid, signal.SIGUSR1)
    assert run.wait(300) == signals.REQUEUE_EXIT, run.tail()
    text = run.text()
    assert "stopped by signal 10" in text
    assert text.count("replacing the collector") == 1, text[-4000:]  # none died of USR1
    # (a push between the server's kill and its replacement finds it gone: not after)
    assert "the inference server is gone" not in text[before_the_stop:], text[-4000:]
    assert text.count("replacing the render pool") == 1, text[-4000:]
    assert len(re.findall(r"evaluation process.* died", text)) == 1, text[-4000:]
    # multiprocessing's resource tracker outlives the driver by a moment, by design
    assert all_gone(replaced) == [], "a child outlived the run"
    rows = read_metrics(logdir)
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(set(steps))
    # nothing counted twice or lost across the replaced collector
    assert all(row["replay/size"] == row["env_steps"] for row in rows)
    versions = [row["policy_version"] for row in rows]
    assert versions == sorted(versions)
    state = checkpoint.load(checkpoint.latest(logdir))
    assert state["relaunches"] == {"inference": 1, "eval": 1, "render": 1}
    assert state["episodes"]["restarts"] == 1  # the collector replaced with the dead server
    assert state["steps"]["env_steps"] >= steps[-1]
    evals = [row["env_steps"] for row in read_metrics(logdir, "eval")]
    assert evals == sorted(set(evals))
    # every evaluation that fell due wrote its row, or was skipped with a line saying so
    # (the one before it still ran), or was in flight at the stop (the resumed run plays
    # it); the last may not have fallen due before the stop was seen
    skipped = re.findall(r"eval at env step (\d+) skipped", text)
    in_flight = (state.get("evaluation") or {}).get("step")
    accounted = len(evals) + len(skipped) + (in_flight is not None)
    assert accounted >= state["steps"]["env_steps"] // EVERY - 1, (evals, skipped, in_flight)
