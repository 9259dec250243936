"""Greedy evaluation, on a process of its own during training, as ``eval/*`` metrics."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from tensordict import TensorDict, TensorDictBase
from torchrl.collectors import Evaluator
from torchrl.envs import EnvBase, SerialEnv

from dreamer import torchrl_compat as compat
from dreamer.agent.build import latent_sizes
from dreamer.agent.spaces import EnvSpaces
from dreamer.data.collect import build_policy
from dreamer.envs.make import ACHIEVEMENTS_KEY, make_env
from dreamer.evaluation.reports import crafter_score
from dreamer.runtime.relaunches import Relaunches
from dreamer.runtime.signals import children_keep_signals, stop_moment

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_000  # eval worlds differ from every training worker's
BUILD_TIMEOUT = 120.0  # s a shutdown waits for an evaluation process still being started


@dataclass
class EvalResult:
    """One evaluation's episodes; ``frames``: the first one's, ``achievements``: rates in %."""

    returns: list[float]
    lengths: list[int]
    frames: np.ndarray | None = None
    achievements: dict[str, float] = field(default_factory=dict)
    step: int = 0

    def metrics(self) -> dict[str, float]:
        returns = np.asarray(self.returns, np.float64)
        metrics = {
            "eval/return": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/length": float(np.mean(self.lengths)),
            "eval/episodes": len(self.returns),
        }
        if self.achievements:
            for name, rate in self.achievements.items():
                metrics[f"eval/achievements/{name}"] = rate
            metrics["eval/crafter_score"] = crafter_score(list(self.achievements.values()))
        return metrics


def summarize(
    episodes: list[TensorDictBase], image: str | None, achievement_names: tuple[str, ...]
) -> EvalResult:
    """``episodes``: one [T] tensordict each; returns in env units (before reward scaling)."""
    result = EvalResult(
        returns=[float(e.get(("next", "episode_reward"))[-1]) for e in episodes],
        lengths=[int(e.get(("next", "step_count"))[-1]) for e in episodes],
    )
    if image is not None:
        result.frames = episodes[0].get(("next", image)).numpy()
    if achievement_names:
        unlocked = np.stack([e.get(("next", ACHIEVEMENTS_KEY))[-1].numpy() > 0 for e in episodes])
        rates = 100 * unlocked.mean(0)
        result.achievements = dict(zip(achievement_names, rates.tolist()))
    return result


def split_episodes(batch: TensorDictBase) -> list[TensorDictBase]:
    """A collector's flat ("cat") batch of whole trajectories, one tensordict each."""
    ids = batch.get(("collector", "traj_ids")).reshape(-1)
    return [batch[ids == trajectory] for trajectory in ids.unique(sorted=True)]


def make_eval_env(
    env: dict, latent: tuple[int, int], seed: int, count: int, step_cap: int
) -> EnvBase:
    if count == 1:
        return make_env(env, seed, latent, step_cap)
    makers = [functools.partial(make_env, env, seed + i, latent, step_cap) for i in range(count)]
    return SerialEnv(count, makers)


@contextlib.contextmanager
def _quiet_end_of(thread, step):
    """Log one line, not a traceback, when a shutdown ends the worker ``thread`` waits on,
    then or later: a thread the shutdown leaves (a daemon, waiting for a killed process)
    may still get that process's last message and raise after the shutdown returned."""
    previous = threading.excepthook

    def hook(args):
        if args.thread is thread:
            log.info("eval at env step %s stopped by the shutdown", step)
        else:
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        if thread is None or not thread.is_alive():
            threading.excepthook = previous


def _wait_for_builder(thread: threading.Thread, ended: bool) -> None:
    """torchrl's evaluator ``thread``, woken by a shutdown, ends once it has built the
    process (long only while the process makes its env), or at once if the process has
    ``ended`` (its pipe closes), unless it waits for that process's weight acknowledgement:
    one killed before it sent it never does (that wait has no timeout; the thread is a
    daemon), and the join waited its whole 120 s."""
    deadline = time.monotonic() + BUILD_TIMEOUT
    while thread.is_alive() and time.monotonic() < deadline:
        if ended and compat.waits_for_weight_acknowledgement(thread):
            return
        thread.join(0.05)


class EvalRunner:
    """Plays ``eval.episodes`` episodes with the mode action: in the background during
    training (``trigger``, then ``poll``) or blocking (``run``). At most one is in flight,
    in the process of torchrl's ``Evaluator``, which does not survive it: ``check``
    replaces a dead one and runs the evaluation in flight again, once."""

    def __init__(
        self,
        cfg,
        env,
        spaces: EnvSpaces,
        achievement_names: tuple[str, ...],
        relaunches: Relaunches | None = None,
    ):
        """The runner for a run's ``eval.*`` (``env``: ``dreamer.envs.env_config``'s node)."""
        eval_cfg, model, seed = cfg.eval, cfg.model, cfg.run.seed
        self.image = next((key.name for key in spaces.image_keys), None)
        self.achievement_names = achievement_names
        self.timeout = eval_cfg.timeout
        self.relaunches = relaunches if relaunches is not None else Relaunches()
        self._make_evaluator = functools.partial(
            Evaluator,
            functools.partial(
                make_eval_env,
                env,
                latent_sizes(model),
                seed + EVAL_SEED_OFFSET,
                eval_cfg.envs,
                eval_cfg.max_steps,
            ),
            policy_factory=functools.partial(build_policy, model, spaces, seed, 1),
            num_trajectories=eval_cfg.episodes,
            frames_per_batch=eval_cfg.envs * 100,
            collector_kwargs={"traj_format": "cat"},
            metrics_fn=self._summarize,
            backend="process",
        )
        self.evaluator = self._make_evaluator()
        self.pending_step: int | None = None
        self._pending_weights = None  # kept to run the evaluation again
        self._attempt = 0
        self._announced: int | None = None

    def _summarize(self, batch: TensorDictBase) -> dict:
        # torchrl hands what this returns back as "eval/<key>"
        return {"result": summarize(split_episodes(batch), self.image, self.achievement_names)}

    @staticmethod
    def _result(raw: dict) -> EvalResult:
        result: EvalResult = raw["eval/result"]
        result.step = int(raw["eval/step"])
        return result

    def run(self, step: int, policy) -> EvalResult:
        return self._result(self.evaluator.evaluate(policy, step=step))

    def process(self):
        """The evaluation's ``multiprocessing.Process`` once started (torchrl has no accessor),
        also while torchrl is still building its collector (the process is making its env)."""
        collector = compat.evaluator_collector(self.evaluator)
        procs = getattr(collector, "procs", None) or []
        procs = procs or compat.evaluator_processes_being_started(self.evaluator)
        return procs[0] if procs else None

    def _died(self) -> bool:
        process = self.process()
        if process is not None and not process.is_alive():
            return True
        # the backend thread ends when it finds its process dead (ident: it was started)
        thread = compat.evaluator_thread(self.evaluator)
        started = thread is not None and thread.ident is not None
        return self.pending_step is not None and started and not thread.is_alive()

    def trigger(self, step: int, policy) -> None:
        self.check()
        if self.pending_step is not None:
            log.warning(
                "eval at env step %d skipped: the one at step %s still runs",
                step,
                self.pending_step,
            )
            return
        self._pending_weights = Evaluator.extract_weights(policy)
        self._attempt = 1
        self._submit(step)

    def _submit(self, step: int) -> None:
        with children_keep_signals():  # torchrl starts the process from a thread started here
            accepted = self.evaluator.trigger_eval(self._pending_weights, step=step)
            stop_moment("eval_start")
        if accepted:
            self.pending_step = step
        else:
            log.warning("eval at env step %d skipped: the evaluator is busy", step)

    def check(self) -> None:
        """Relaunch a dead evaluation process, and rerun (or skip) what it was doing."""
        process = self.process()
        if process is not None and process.pid != self._announced:
            self._announced = process.pid
            log.info("evaluation process pid: %d", process.pid)
        if not self._died():
            return
        step, attempt = self.pending_step, self._attempt
        self.relaunches.replacing(
            "eval",
            "the evaluation process"
            + (f" (pid {process.pid}, exit code {process.exitcode})" if process else "")
            + " died"
            + (f" during the evaluation at env step {step}" if step is not None else ""),
            "it",
        )
        try:
            self.evaluator.shutdown(timeout=5.0)
        except Exception as error:  # noqa: BLE001 - what is left of it goes anyway
            log.warning("shutting down the dead evaluator: %s", error)
        self.evaluator = self._make_evaluator()
        self.pending_step = None
        if step is None:
            return
        if self.relaunches.again(attempt):
            log.warning("running the evaluation at env step %d again", step)
            self._attempt = attempt + 1
            self._submit(step)
        else:
            log.error(
                "the evaluation at env step %d is skipped: its process died %d times",
                step,
                attempt,
            )
            self._pending_weights = None

    def poll(self, timeout: float = 0) -> EvalResult | None:
        """The finished evaluation's result, if any; relaunches a dead evaluation process."""
        raw = self.evaluator.poll(timeout)
        if raw is None:
            self.check()
            return None
        self.pending_step, self._pending_weights = None, None
        return self._result(raw)

    def finish(self) -> EvalResult | None:
        """Wait up to ``eval.timeout`` s for the evaluation in flight, if any."""
        if self.pending_step is None:
            return None
        log.info("waiting for the evaluation at env step %d", self.pending_step)
        step, deadline = self.pending_step, time.monotonic() + self.timeout
        while self.pending_step is not None and time.monotonic() < deadline:
            if (result := self.poll(min(1.0, max(deadline - time.monotonic(), 0)))) is not None:
                return result
        if self.pending_step is not None:
            log.error("the evaluation at env step %d did not finish in %.0f s", step, self.timeout)
        return None

    def state_dict(self) -> dict:
        """The evaluation in flight (its step and weights), for a resumed run to play."""
        weights = self._pending_weights  # a TensorDict, saved as plain dicts (weights_only)
        plain = None if weights is None else weights.to_dict()
        return {"step": self.pending_step, "weights": plain}

    def load_state_dict(self, state: dict) -> None:
        """Play the evaluation that was in flight when the checkpoint was written."""
        if state["step"] is None or state["weights"] is None:
            return
        log.info("the evaluation at env step %d was in flight: playing it again", state["step"])
        self._pending_weights, self._attempt = TensorDict(state["weights"]), 1
        self._submit(state["step"])

    def shutdown(self, timeout: float = 10.0, wanted: bool = True) -> None:
        """Stop the evaluation process, ending it if it outlives torchrl's 5 s shutdown:
        multiprocessing joins its children at exit, so it would hold the run's exit. Not
        ``wanted`` (a stopped run: the checkpoint holds the evaluation in flight, which the
        resumed run plays again), a running one is killed: its worker reads torchrl's
        close only between batches, so a stop mid-episode waited ~13 s (the evaluator's
        5 s join, then the collector's 8 s grace) before it was terminated."""
        process = self.process()
        thread = compat.evaluator_thread(self.evaluator)
        with _quiet_end_of(thread, self.pending_step):  # the kill may end the thread at once
            if not wanted and process is not None and process.is_alive():
                process.kill()
                process.join(timeout)
            ended = process is not None and process.exitcode is not None
            self.evaluator.shutdown()
            # a trigger just before may still be building the process in torchrl's thread,
            # which the shutdown waits only 5 s for: wait, then close what it built
            if thread is not None and thread.ident is not None:
                _wait_for_builder(thread, ended)
                self.evaluator.shutdown()  # a no-op where the first one closed it
        process = process or self.process()
        if process is not None and process.is_alive():
            log.warning("the evaluation process outlived its shutdown; terminating it")
            process.terminate()
            process.join(timeout)
            if process.is_alive():
                process.kill()
                process.join(timeout)
