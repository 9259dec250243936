"""An evaluation triggered right before the run stops: its process may still be
starting when torchrl's evaluator gives up waiting (5 s), and must not outlive the
shutdown (multiprocessing joins a run's children at exit: the run would never end)."""

import logging
import multiprocessing
import threading
import time

import pytest
from omegaconf import OmegaConf

from dreamer.agent.build import build_agent
from dreamer.command_line import load
from dreamer.envs.make import describe_env, env_config
from dreamer.evaluation.runner import EvalRunner


def triggered(tmp_path, **slow_start) -> EvalRunner:
    """A runner whose evaluation at env step 0 was just triggered, on the smoke preset's
    agent and ``SlowStart-v0`` with ``slow_start`` (its delays and files)."""
    cfg = load(["experiment=smoke", "env=gym", "env.id=tests.faulty_env:SlowStart-v0"])
    env = env_config(cfg.env, tmp_path)
    spaces, achievements = describe_env(env, 0)
    env = OmegaConf.merge(env, {"kwargs": slow_start})
    agent = build_agent(cfg.model, cfg.learner, spaces)
    runner = EvalRunner(cfg, env, spaces, achievements)
    runner.trigger(0, agent.policy)  # the process starts in torchrl's backend thread
    return runner


def wait_for(path, what: str) -> None:
    """Until the evaluation's env creates ``path`` (its own moment)."""
    deadline = time.monotonic() + 120
    while not path.exists():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.slow
def test_a_shutdown_right_after_a_trigger_closes_the_evaluation_process_it_started(
    tmp_path, caplog
):
    before = set(multiprocessing.active_children())
    # the evaluation process takes 8 s to make its env: past torchrl's 5 s shutdown wait
    runner = triggered(tmp_path, delay=8.0)
    with caplog.at_level(logging.INFO):
        runner.shutdown()
    started = [p for p in multiprocessing.active_children() if p not in before]
    assert not [p for p in started if p.is_alive()], "an evaluation process outlived the run"
    # closed as torchrl closes its workers (exit code 0), not terminated with a warning:
    # a run stopped with Ctrl-C as its evaluation starts says only what a stop says
    assert runner.process() is not None and runner.process().exitcode == 0
    assert "outlived its shutdown" not in caplog.text


@pytest.mark.slow
def test_a_stop_during_an_evaluation_ends_it_at_once_without_a_traceback(
    tmp_path, monkeypatch, caplog
):
    """A stopped run's evaluation in flight is in its checkpoint (the resumed run plays
    it again): the stop ends its process where it is, mid-episode. torchrl's worker
    reads a close only between batches: the stop waited ~13 s here (its 5 s join, then
    its collector's 8 s grace). torchrl's evaluator thread, blocked on its worker's
    results, raises when that worker ends: not printed as a crash."""
    stepped = tmp_path / "stepped"  # a byte per step of the evaluation's env
    uncaught = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    runner = triggered(tmp_path, step_delay=1.0, stepped=str(stepped))
    wait_for(stepped, "the evaluation never stepped its env")  # 50 steps of 1 s each
    assert runner.process().is_alive() and runner.pending_step == 0
    before = stepped.stat().st_size
    with caplog.at_level(logging.INFO):
        runner.shutdown(wanted=False)
    assert not runner.process().is_alive()
    # the step under way at most: a step began only if the kill came over 1 s late
    assert stepped.stat().st_size <= before + 1
    assert not uncaught, [f"{a.exc_type.__name__}: {a.exc_value}" for a in uncaught]
    assert "eval at env step 0 stopped by the shutdown" in caplog.text
    assert "outlived its shutdown" not in caplog.text


@pytest.mark.slow
def test_a_stop_while_the_evaluation_process_starts_kills_it_at_once(tmp_path, monkeypatch, caplog):
    """An evaluation process still making its env (a slow env's start) is not yet in the
    collector torchrl hands back: a stop must still find it and kill it, or its shutdown
    waited 120 s for torchrl's thread, then left the process running, and a run's exit
    waits for its children (an hour here). Nor may it wait for torchrl's thread when a
    killed process never acknowledges its weights (a USR1 within ~0.3 s of an
    evaluation's trigger took 130 s to end a run)."""
    making = tmp_path / "making"  # the evaluation process is making its env (for an hour)
    uncaught = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    runner = triggered(tmp_path, delay=3600.0, making=str(making))
    wait_for(making, "the evaluation process never began its env")
    process = runner.process()
    assert process is not None and process.is_alive()
    stopping = threading.Thread(target=runner.shutdown, kwargs={"wanted": False}, daemon=True)
    with caplog.at_level(logging.INFO):
        stopping.start()
        stopping.join(60)  # a hang detector, not a timing: seconds, against 120 s or more
    assert not stopping.is_alive(), "the shutdown waits for torchrl's thread"
    assert not process.is_alive()
    assert not uncaught, [f"{a.exc_type.__name__}: {a.exc_value}" for a in uncaught]
    assert "eval at env step 0 stopped by the shutdown" in caplog.text
    assert "outlived its shutdown" not in caplog.text
