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


@pytest.mark.slow
def test_a_shutdown_right_after_a_trigger_closes_the_evaluation_process_it_started(
    tmp_path, caplog
):
    cfg = load(["experiment=smoke", "env=gym", "env.id=tests.faulty_env:SlowStart-v0"])
    env = env_config(cfg.env, tmp_path)
    spaces, achievements = describe_env(env, 0)
    # the evaluation process takes 8 s to make its env: past torchrl's 5 s shutdown wait
    env = OmegaConf.merge(env, {"kwargs": {"delay": 8.0}})
    agent = build_agent(cfg.model, cfg.learner, spaces)
    before = set(multiprocessing.active_children())
    runner = EvalRunner(cfg, env, spaces, achievements)
    runner.trigger(0, agent.policy)  # the process starts in torchrl's backend thread
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
    cfg = load(["experiment=smoke", "env=gym", "env.id=tests.faulty_env:SlowStart-v0"])
    env = env_config(cfg.env, tmp_path)
    spaces, achievements = describe_env(env, 0)
    stepped = tmp_path / "stepped"  # a byte per step of the evaluation's env
    env = OmegaConf.merge(env, {"kwargs": {"step_delay": 1.0, "stepped": str(stepped)}})
    agent = build_agent(cfg.model, cfg.learner, spaces)
    uncaught = []
    monkeypatch.setattr(threading, "excepthook", uncaught.append)
    runner = EvalRunner(cfg, env, spaces, achievements)
    runner.trigger(0, agent.policy)
    deadline = time.monotonic() + 120
    while not stepped.exists():  # into its episodes (50 steps of 1 s each)
        assert time.monotonic() < deadline, "the evaluation never stepped its env"
        time.sleep(0.05)
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
