"""The MineDojo adapter against the stand-in simulator (tests/standins/minedojo): the
adapter is imported as in production; only the ``minedojo`` module is replaced."""

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from dreamer.envs.minedojo import (
    DESTROY,
    FUNCTIONAL,
    MineDojoEnv,
    MineDojoLaunchError,
)
from dreamer.envs.restarts import Restarting
from dreamer.errors import ConfigError
from dreamer.runtime import signals
from tests.runs import UNTIL_STOPPED, Trainer, read_metrics, wait_until

STANDINS = Path(__file__).resolve().parent / "standins"
sys.path.insert(0, str(STANDINS))
ATTACK, NOOP = FUNCTIONAL.index("attack"), FUNCTIONAL.index("noop")
PITCH_DOWN = FUNCTIONAL.index("pitch_down")


@pytest.fixture(autouse=True)
def fast_launch(monkeypatch, tmp_path):
    monkeypatch.setenv("MINEDOJO_STANDIN_LAUNCH_SECONDS", "0")
    monkeypatch.setenv("MINEDOJO_STANDIN_CRASH_DIR", str(tmp_path / "crash-dir"))


def make(tmp_path, **kwargs) -> MineDojoEnv:
    options = dict(task="open-ended", launch_lock=str(tmp_path / "launch.lock"), seed=1)
    return MineDojoEnv(**(options | kwargs))


def test_observations_match_the_declared_spaces(tmp_path):
    env = Restarting(lambda: make(tmp_path))  # as make_env wraps every adapter
    obs, info = env.reset()
    assert env.observation_space.contains(obs) and info == {"restart": 0}
    assert obs["mask_action"][FUNCTIONAL.index("drop")] == 0  # nothing in the main hand
    for step in range(24):
        obs, *_ = env.step((step % ATTACK + 1, 0, 0))  # movement, camera, use, drop, attack
        assert env.observation_space.contains(obs)
    env.close()


def test_harvest_milestone_and_inventory_max(tmp_path):
    env = make(tmp_path, milestone_reward=True, sticky_attack=0)
    obs, _ = env.reset()
    assert not obs["inventory"].any()
    rewards = []
    while not obs["inventory"].any():
        obs, reward, *_ = env.step((ATTACK, 0, 0))
        rewards.append(reward)
    item = int(np.flatnonzero(obs["inventory"])[0])
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0  # the first time this item is obtained
    assert obs["mask_destroy"][item] == 1 and obs["inventory_max"][item] == obs["inventory"][item]
    count = obs["inventory"][item]
    obs, reward, *_ = env.step((DESTROY, 0, item))  # through the item head -> its slot
    assert obs["inventory"][item] == 0 and obs["inventory_max"][item] == count
    assert reward == 0.0
    seen = {item}
    for _ in range(40):  # every reward is the number of items never held before
        obs, reward, *_ = env.step((ATTACK, 0, 0))
        held = set(np.flatnonzero(obs["inventory"]).tolist())
        assert reward == len(held - seen)
        seen |= held
    assert obs["inventory"][item] > 0, "the destroyed item was never harvested again"
    env.close()


def test_sticky_attack_reaches_the_simulator(tmp_path):
    env = make(tmp_path, sticky_attack=4, break_speed=0.1)  # slow breaking: nothing drops
    env.reset()
    sent = []
    for action in [ATTACK] + [NOOP] * 6:
        env.step((action, 0, 0))
        sent.append(int(env._sim.last_action[5]))
    assert sent == [3, 3, 3, 3, 3, 0, 0]
    env.close()


def test_pitch_stays_within_the_limit(tmp_path):
    env = make(tmp_path, pitch_limit=45)
    env.reset()
    pitches = []
    for _ in range(8):
        native, *_ = env.step((PITCH_DOWN, 0, 0))
        pitches.append(float(env._native_obs["location_stats"]["pitch"][0]))
    assert max(pitches) == 45 and pitches[:3] == [15, 30, 45]
    env.close()


def test_max_steps_truncates(tmp_path):
    env = make(tmp_path, max_steps=5)
    env.reset()
    ends = [env.step((NOOP, 0, 0))[2:4] for _ in range(5)]
    assert ends == [(False, False)] * 4 + [(False, True)]
    env.close()


def test_a_crashed_simulator_is_relaunched(tmp_path):
    env = Restarting(lambda: make(tmp_path))  # as make_env wraps every adapter
    env.reset()
    first = env.env._sim
    first.crash_after(2)
    results = [env.step((NOOP, 0, 0)) for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]  # the crash ends it as truncated
    assert [r[4]["restart"] for r in results] == [0, 0, 1] and env.restarts == 1
    assert env.env._sim is not first and first.closed
    obs, _ = env.reset()
    assert env.step((NOOP, 0, 0))[4]["restart"] == 0  # the new simulator works
    env.close()


def _launch(lock: str, log: str, seconds: str, ready) -> None:
    os.environ["MINEDOJO_STANDIN_LOG"] = log
    os.environ["MINEDOJO_STANDIN_LAUNCH_SECONDS"] = seconds
    sys.path.insert(0, str(STANDINS))
    env = MineDojoEnv("open-ended", launch_lock=lock)
    ready.wait(60)  # both processes launch at the same moment
    env.reset()
    env.close()


def launch_intervals(tmp_path, locks: list[str]) -> list[tuple[float, float]]:
    log = tmp_path / "launches.log"
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(len(locks))
    workers = [
        context.Process(target=_launch, args=(lock, str(log), "1.0", ready)) for lock in locks
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    lines = [line.split() for line in log.read_text().splitlines()]
    return sorted((float(start), float(end)) for _, start, end in lines)


def test_launches_are_serialised_by_the_lock(tmp_path):
    (a_start, a_end), (b_start, b_end) = launch_intervals(tmp_path, [str(tmp_path / "l")] * 2)
    assert b_start >= a_end, "two simulators launched at once"
    # control: with separate locks the same two launches do overlap
    (tmp_path / "launches.log").unlink()
    (a_start, a_end), (b_start, _) = launch_intervals(
        tmp_path, [str(tmp_path / "l1"), str(tmp_path / "l2")]
    )
    assert b_start < a_end


def test_launch_lock_timeout_is_a_clear_error(tmp_path):
    lock = tmp_path / "held.lock"
    env = make(tmp_path, launch_lock=str(lock), launch_timeout=0.5)
    with FileLock(lock):
        with pytest.raises(MineDojoLaunchError, match="held.lock.*another process holds it"):
            env.reset()
    env.close()


def test_unknown_task_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="env.task: unknown MineDojo task 'harvest_nothing'"):
        make(tmp_path, task="harvest_nothing")


def test_missing_minedojo_is_one_line_exit_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "dreamer.train", "env=minedojo", f"run.logdir={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert f"needs minedojo; install it with {sys.executable} -m pip install" in result.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_train_end_to_end_with_a_crash(tmp_path):
    """4 process workers on the stand-in, masked multi-head actions; one simulator dies
    mid-run, is relaunched, and the run completes."""
    logdir, crash_dir = tmp_path / "run", tmp_path / "crash"
    crash_dir.mkdir()
    trainer = Trainer(
        logdir,
        "experiment=smoke",
        "env=minedojo",
        "env.task=open-ended",
        "env.milestone_reward=true",
        "env.max_steps=200",
        "run.envs=4",
        UNTIL_STOPPED,
        "run.train_ratio=4",  # few updates: this test is about the env and the actor
        "eval.every=0",  # an eval env would launch a sixth simulator
        "run.train_starts=300",
        "run.log_every=100",
        log=tmp_path / "run.log",
        env={
            "PYTHONPATH": os.pathsep.join([str(STANDINS), os.environ.get("PYTHONPATH", "")]),
            "MINEDOJO_STANDIN_CRASH_DIR": str(crash_dir),
            "MINEDOJO_STANDIN_LOG": str(tmp_path / "launches.log"),
        },
    )
    trainer.wait_rows(timeout=600)
    (crash_dir / "crash").touch()  # the next simulator step anywhere dies
    # the run goes on past the relaunch: a row counts the restart, training continues
    restarted = wait_until(
        lambda: [row for row in read_metrics(logdir, live=True) if row.get("env/restarts")],
        "a row after the restart",
        timeout=600,
        running=trainer,
    )
    updates = restarted[0]["updates"]
    wait_until(
        lambda: [row for row in read_metrics(logdir, live=True) if row["updates"] > updates],
        "an update after the restart",
        timeout=600,
        running=trainer,
    )
    assert trainer.stop() == signals.REQUEUE_EXIT, trainer.tail()
    log = trainer.text()
    rows = read_metrics(logdir)
    assert rows[-1]["env/restarts"] == 1
    assert len(list(crash_dir.glob("crash.claimed.*"))) == 1
    launches = (tmp_path / "launches.log").read_text().splitlines()
    assert len(launches) == 4 + 1  # one per worker, one relaunch (the spec probe launches none)
    intervals = sorted(tuple(map(float, line.split()[1:])) for line in launches)
    assert all(b[0] >= a[1] for a, b in zip(intervals, intervals[1:])), "overlapping launches"
    assert "ProcessSlotTransport" in log
    assert "rejected" not in log and "ValueError" not in log
