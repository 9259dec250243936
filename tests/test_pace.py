"""Collection paced by the learner (``collector.pace``) and the collector's processes
forked from one preloaded forkserver: real runs, read through /proc."""

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from dreamer.data import collect
from dreamer.learning.learner import learner_threads
from tests.runs import (
    QUICK,
    ROOT,
    UNTIL_STOPPED,
    Trainer,
    alive,
    all_gone,
    command_line,
    descendants,
    parent,
    read_metrics,
    signal_mask,
    trainer_command,
)


def niceness(pid: int) -> int:
    """Field 19 of /proc/<pid>/stat (after the parenthesised command name)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])


@pytest.mark.parametrize(
    ("configured", "cpu", "cores", "resolved"),
    [
        ("auto", True, 2, "stop"),  # the learner shares the cores with collection
        ("auto", True, collect.FEW_CORES, "stop"),
        ("auto", True, collect.FEW_CORES + 1, "none"),  # cores of their own
        ("auto", False, 2, "none"),  # a GPU learner: collection overlaps it
        ("pause", False, 64, "pause"),  # asked for: as asked
        ("none", True, 2, "none"),
    ],
)
def test_auto_paces_a_cpu_learner_on_few_cores(monkeypatch, configured, cpu, cores, resolved):
    monkeypatch.setattr(collect, "usable_cores", lambda: cores)
    assert collect.pace_mode(configured, cpu) == resolved


def test_a_paced_learner_gets_every_core_and_an_unpaced_one_half(monkeypatch):
    import dreamer.learning.learner as learner

    monkeypatch.setattr(learner, "usable_cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpu = torch.device("cpu")
    assert learner_threads(0, cpu, paced=True) == 4
    assert learner_threads(0, cpu, paced=False) == 2
    assert learner_threads(3, cpu, paced=True) == 3  # a configured count stays
    # OMP_NUM_THREADS caps the choice (make test: two trainers on two cores), not a set count
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert learner_threads(0, cpu, paced=True) == 1
    assert learner_threads(3, cpu, paced=True) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert learner_threads(0, cpu, paced=True) == 3
    assert learner_threads(0, cpu, paced=False) == 2


def test_a_gpu_learner_takes_the_cores_collection_leaves_and_sleeps_when_idle(
    monkeypatch, tmp_path
):
    """The first H200 run: a CUDA learner took 16 spinning OpenMP threads beside 16 env
    workers and the inference process on 16 cores."""
    import dreamer.learning.learner as learner
    from dreamer.runtime import openmp

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(learner, "usable_cores", lambda: 16)
    assert learner_threads(0, cuda, collectors=17) == 1  # 16 env workers + inference
    assert learner_threads(0, cuda, collectors=5) == learner.CUDA_THREADS
    assert learner_threads(0, cuda, collectors=14) == 2
    assert learner_threads(6, cuda, collectors=17) == 6  # a configured count stays
    gpus = tmp_path / "gpus"
    (gpus / "0000:00:05.0").mkdir(parents=True)
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    assert openmp.choose_wait_policy([], gpus) == {"OMP_WAIT_POLICY": "PASSIVE"}
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert openmp.choose_wait_policy(["learner.device=cpu"], gpus) == openmp.SPIN
    for name in openmp.SPIN:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU this process may use
    assert openmp.choose_wait_policy([], gpus) == openmp.SPIN
    for name in openmp.SPIN:
        monkeypatch.delenv(name)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert openmp.choose_wait_policy([], tmp_path / "no-driver") == openmp.SPIN


def collector_pids(trainer: Trainer) -> tuple[list[int], int]:
    workers = [int(pid) for pid in trainer.wait_for(r"env worker pids: ([\d ]+)").split()]
    return workers, int(trainer.wait_for(r"inference server pid: (\d+)"))


@pytest.mark.slow
def test_nice_pace_lowers_the_collectors_priority_and_the_run_trains(tmp_path):
    pace = "nice"  # the other paces keep it: test_paced_collection_trains_at_the_ratio...
    trainer = Trainer(
        tmp_path / "run", *QUICK, UNTIL_STOPPED, f"collector.pace={pace}", log=tmp_path / "log"
    )
    workers, server = collector_pids(trainer)
    rows = trainer.wait_rows(2, past=300)
    assert rows[-1]["updates"] > 0
    assert f"collection pace while it updates: {pace}" in trainer.text()
    expected = collect.NICE if pace == "nice" else 0
    assert [niceness(pid) for pid in [*workers, server]] == [expected] * (len(workers) + 1)
    assert niceness(trainer.pid) == 0  # the learner keeps its priority
    # forked from one forkserver, itself forked from the driver (its command line, no
    # interpreter of its own) once the driver had imported what they run
    servers = {parent(pid) for pid in [*workers, server]}
    assert len(servers) == 1, servers
    (forkserver,) = servers
    assert forkserver != trainer.pid and parent(forkserver) == trainer.pid
    assert command_line(forkserver) == command_line(trainer.pid)
    assert trainer.stop() == 75


@pytest.mark.slow
@pytest.mark.parametrize("pace", ["pause", "stop"])
def test_paced_collection_trains_at_the_ratio_and_resumes_collecting(tmp_path, pace):
    """pace=pause parks the collector around every update burst, pace=stop stops its
    processes: the run still trains at its train ratio, collects between bursts (rows
    keep coming, updates grow) and its policy gets the learner's weights."""
    trainer = Trainer(
        tmp_path / "run", *QUICK, UNTIL_STOPPED, f"collector.pace={pace}", log=tmp_path / "log"
    )
    workers, server = collector_pids(trainer)
    held = set()  # the collector's processes seen stopped (state T) while the run trains
    while len(read_metrics(tmp_path / "run", live=True)) < 4:
        held |= {pid for pid in [*workers, server] if collect.stopped(pid)}
        assert trainer.process.poll() is None, trainer.tail()
        time.sleep(0.005)
    assert [niceness(pid) for pid in [*workers, server]] == [0] * (len(workers) + 1)
    assert trainer.stop() == 75
    assert held == ({*workers, server} if pace == "stop" else set()), held
    assert "weight push: Timed out" not in trainer.text()
    rows = read_metrics(tmp_path / "run")
    steps = [row["env_steps"] for row in rows]
    updates = [row["updates"] for row in rows]
    assert steps == sorted(set(steps)) and updates == sorted(updates) and updates[-1] > 0
    # train ratio 4 at batch 4 x 16 (smoke): one update per 16 env steps after 200
    due = (steps[-1] - 200) * 4 / (4 * 16)
    assert abs(updates[-1] - due) <= 4, (updates[-1], due)  # within a collector batch
    assert rows[-1]["policy_version"] > 0  # pushes deferred past a burst still land


@pytest.mark.slow
def test_a_driver_killed_while_it_holds_the_collection_stopped_leaves_no_process(tmp_path):
    """SIGKILL to the driver inside an update burst of pace=stop: its stopped children
    cannot watch for it themselves; they die with the forkserver (PR_SET_PDEATHSIG)."""
    trainer = Trainer(
        tmp_path / "run", *QUICK, UNTIL_STOPPED, "collector.pace=stop", log=tmp_path / "log"
    )
    workers, server = collector_pids(trainer)
    children = descendants(trainer.pid)
    deadline = time.monotonic() + 120
    while not all(collect.stopped(pid) for pid in [*workers, server]):
        assert time.monotonic() < deadline and trainer.process.poll() is None, trainer.tail()
        time.sleep(0.002)
    trainer.kill()
    assert all_gone(children, timeout=30) == []


@pytest.mark.slow
def test_a_stopped_collector_process_outlives_the_hangup_of_its_orphaned_group(tmp_path):
    """A launcher that backgrounds the run and exits orphans the run's process group;
    with a member stopped, the kernel hangs the group up (SIGHUP, then SIGCONT), and
    pace=stop holds the collector stopped most of the time: its stopped processes died
    of it and the run replaced its collector. Here the test stops one env worker itself,
    and a sleeping member of the group the run does not know: the pace may have stopped
    the worker a moment before the test did, and then continued it before the group was
    orphaned (no hangup came once, on a fresh clone's suite); the sleeper stays stopped,
    so the hangup is certain to come."""
    log, pidfile, release = tmp_path / "log", tmp_path / "pid", tmp_path / "release"
    sleeper_file = tmp_path / "sleeper"
    command = shlex.join(trainer_command(tmp_path / "run", *QUICK, UNTIL_STOPPED))
    # set -m: the subshell is a job, a process group of its own in the session, and the
    # trainer and the sleeper its members; the subshell's exit orphans that group
    script = (
        f"set -m; ( {command} > {log} 2>&1 & echo $! > {pidfile}; "
        f"sleep 600 & echo $! > {sleeper_file}; "
        f"until [ -e {release} ]; do sleep 0.01; done ); exec sleep 600"
    )
    session = subprocess.Popen(["bash", "-c", script], cwd=ROOT, start_new_session=True)
    tree: set[int] = set()
    try:
        until(lambda: pidfile.exists() and sleeper_file.exists(), timeout=30)
        driver = int(pidfile.read_text())
        sleeper = int(sleeper_file.read_text())
        # (the backgrounded child opens the log itself: after the pid is written, at times)
        until(lambda: log.exists() and "inference server pid:" in log.read_text(), timeout=300)
        worker = int(re.search(r"env worker pids: (\d+)", log.read_text())[1])
        tree = descendants(driver) | {sleeper}
        assert os.getpgid(sleeper) == os.getpgid(driver) == os.getpgid(worker)
        os.kill(sleeper, signal.SIGSTOP)
        os.kill(worker, signal.SIGSTOP)
        until(lambda: collect.stopped(sleeper) and collect.stopped(worker))
        switched = context_switches(worker)  # a stopped process switches no more
        launcher = parent(driver)
        release.touch()
        until(lambda: parent(driver) != launcher)  # the subshell is gone
        # the hangup came (the worker's SIGHUP blocked, pending; the sleeper dies of its own
        # unless the suite runs with SIGHUP ignored, as under nohup) and SIGCONT woke the
        # worker: it ran since, though the pace may stop it again for a burst (a poll of its
        # state missed every short run between bursts once)
        until(lambda: not alive(worker) or signal_mask(worker, "ShdPnd") & HANGUP)
        assert alive(worker), log.read_text()[-3000:]
        until(lambda: context_switches(worker) > switched)
        rows = len(read_metrics(tmp_path / "run", live=True))
        until(lambda: len(read_metrics(tmp_path / "run", live=True)) > rows + 1, timeout=120)
        assert "replacing the collector" not in log.read_text()
        os.kill(driver, signal.SIGTERM)
        until(lambda: not alive(driver), timeout=120)
    finally:
        session.kill()
        with contextlib.suppress(FileNotFoundError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        for pid in tree:  # a stopped worker cannot notice that its driver is gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "stopped by signal" in log.read_text()


HANGUP = 1 << (signal.SIGHUP - 1)


def context_switches(pid: int) -> int:
    """Its main thread's context switches, voluntary and not (/proc/<pid>/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return sum(
        int(n) for n in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", status, re.M)
    )


def until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.005)


def test_pace_stop_continues_only_what_it_stopped(tmp_path):
    """A process someone else stopped (a debugger, a test) stays stopped after a burst."""
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        os.kill(sleepers[1].pid, signal.SIGSTOP)
        until(lambda: collect.stopped(sleepers[1].pid))  # a signal is delivered, not at once
        paced = collect.SelfHealingCollector(make=None, pace="stop")
        paced.pids = [sleeper.pid for sleeper in sleepers]
        with paced.paced():
            assert paced.held == [sleepers[0].pid]
            until(lambda: all(collect.stopped(sleeper.pid) for sleeper in sleepers))
        until(lambda: not collect.stopped(sleepers[0].pid))
        assert collect.stopped(sleepers[1].pid)
        with paced.paced(active=False):  # no updates due: nothing stopped
            assert not collect.stopped(sleepers[0].pid)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "1000"}),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}),
        ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "300000"}),
    ],
)
def test_the_trainer_sets_the_openmp_spin_before_torch_loads(environment, expected):
    """Importing the trainer sets libgomp's spin before torch is imported (libgomp reads
    it when it loads), unless the user set either variable: the probe records the
    variables at the moment torch's import starts, through an import hook."""
    probe = """
import importlib.abc, json, os, sys
KEYS = ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')
seen = {}
class WhenTorchLoads(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == 'torch' and not seen:
            seen.update({k: os.environ.get(k) for k in KEYS})
        return None
sys.meta_path.insert(0, WhenTorchLoads())
import dreamer.train  # the command: reads the command line without torch
import dreamer.training.loop  # the run: torch
print(json.dumps(seen))
"""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**clean, **environment},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected


def acting_collector(
    pace: str, *overrides: str, start_weights: bool = False
) -> collect.SelfHealingCollector:
    """The trainer's collector on the cue task (2 env workers and an inference process),
    its batches returned rather than stored; ``start_weights``: the policy's weights
    handed to it as the trainer does, for its first step."""
    from omegaconf import OmegaConf

    from dreamer.agent.build import latent_sizes
    from dreamer.command_line import load
    from dreamer.envs.make import probe_env

    cfg = load(["experiment=cue", "run.envs=2", *overrides])
    env = OmegaConf.to_container(cfg.env)
    spaces, _, sample = probe_env(env, 0, latent_sizes(cfg.model))

    def make(_replacements: int):
        collector = collect.make_collector(
            env=env,
            model=cfg.model,
            spaces=spaces,
            sample=sample,
            policy=result.policy,
            envs=2,
            collector=OmegaConf.to_container(cfg.collector),
            seed=0,
            replay=None,
        )
        if start_weights:
            collect.hand_start_weights(collector, result.policy)
        return collector

    result = collect.SelfHealingCollector(make, pace=pace)
    result.policy = collect.build_policy(cfg.model, spaces, seed=1, threads=1)
    return result


@pytest.mark.slow
def test_a_push_to_a_server_stopped_before_the_burst_times_out_and_lands_on_resume(caplog):
    """The weight-push timeout under pace=stop, step by step: the inference process
    stopped by someone else (a debugger, a swapped-out node) before an update burst stays
    stopped through it, the push due in the burst goes out at its end and gives up after
    ``push_timeout`` (the learner waits no longer), and the process, once continued,
    takes those weights before acting on: its transitions carry the new version.

    (A stop that falls inside a burst cannot be told from the pace's own and ends with
    the burst; one while the loop waits for transitions starves the loop, so no push is
    due: the trainer-level death test cannot aim at this moment, this one can.)"""
    collector = acting_collector("stop")
    collector.start()
    try:
        batches = iter(collector)
        assert int(next(batches)["policy_version"].max()) == 0
        server = collector.pids[-1]
        os.kill(server, signal.SIGSTOP)
        until(lambda: collect.stopped(server))
        timeout = 1.0
        with caplog.at_level("WARNING", logger="dreamer.data.collect"):
            with collector.paced():
                assert server not in collector.held and collector.held  # the workers only
                collector.push(collector.policy, timeout)
                assert collector.deferred is not None  # held until the burst ends
                ended = time.monotonic()
            waited = time.monotonic() - ended
        # the push went out at the burst's end and gave up after its timeout, not torchrl's 300 s
        assert "the policy keeps its weights until the next push" in caplog.text
        assert timeout * 0.9 <= waited < timeout + 30, waited
        assert collect.stopped(server)  # the pace continued only what it stopped
        assert not any(collect.stopped(pid) for pid in collector.pids[:-1])
        os.kill(server, signal.SIGCONT)
        deadline = time.monotonic() + 120
        while int(next(batches)["policy_version"].max()) < 1:
            assert time.monotonic() < deadline, "the timed-out push never landed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(collector.pids[-1], signal.SIGCONT)
        collector.shutdown()


def native_threads() -> int:
    """This process's threads that Python did not start (libgomp's, OpenBLAS's, ...)."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


@pytest.mark.slow
def test_a_weight_push_starts_no_openmp_team_beside_the_learners():
    """A push hands the weights to a queue whose feeder thread pickles them; pickling a
    tensor outside shared memory copies it there in that thread, and a parallel copy
    starts that thread's own OpenMP team, kept for the rest of the run (libgomp then
    counts more OpenMP threads than CPUs and ignores the spin the trainer chose). The
    weights handed to the collector for its start, and pushes that landed, leave the
    process's native threads as they were."""
    threads = torch.get_num_threads()
    # weights a copy runs in parallel
    collector = acting_collector("none", "model=size1m", start_weights=True)
    torch.set_num_threads(2)  # the learner's team: the feeder's would be as wide
    torch.randn(1 << 20).mul_(2)  # ... and started now, before counting
    collector.start()  # the processes: the weights go with the first batch
    try:
        before = native_threads()
        batches = iter(collector)
        assert int(next(batches)["policy_version"].max()) == 1  # acts with the start weights
        assert native_threads() == before
        for version in (2, 3):
            collector.push(collector.policy, timeout=60)
            deadline = time.monotonic() + 120
            while int(next(batches)["policy_version"].max()) < version:
                assert time.monotonic() < deadline, "the push never landed"
        assert native_threads() == before
    finally:
        collector.shutdown()
        torch.set_num_threads(threads)
