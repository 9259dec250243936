"""Rank 0's evaluations every ``eval.every`` env steps, as metrics rows and reports."""

from __future__ import annotations

import logging
from pathlib import Path

from dreamer.evaluation.render import RenderPool, pool_size
from dreamer.evaluation.reports import submit_reports
from dreamer.evaluation.runner import EvalResult, EvalRunner
from dreamer.outputs.logs import MetricsWriter, has_eval_row
from dreamer.runtime.schedules import Clock

log = logging.getLogger("dreamer")


class PeriodicEvaluation:
    def __init__(self, cfg, logdir: Path, parts, writer: MetricsWriter, start: int):
        self.cfg, self.logdir, self.parts, self.writer = cfg, logdir, parts, writer
        self.runner = EvalRunner(cfg, parts.env, parts.spaces, parts.achievements, parts.relaunches)
        self.pool = RenderPool(
            pool_size(cfg.eval.render_workers), parts.relaunches, on_file=writer.log_file
        )
        self.pool_started = False
        self.due = Clock.aligned(cfg.eval.every, start)

    def resume(self, resume: dict | None) -> None:
        """Rerun the evaluation in flight when the last run stopped, unless its row exists."""
        in_flight = (resume or {}).get("evaluation") or {"step": None}
        if in_flight["step"] is not None and not has_eval_row(self.logdir, in_flight["step"]):
            self.start_pool()
            self.runner.load_state_dict(in_flight)

    def start_pool(self) -> None:
        """Start the render pool at the first evaluation, not with the run: on few cores
        its imports took the CPU the run's first env steps and updates needed."""
        if not self.pool_started:
            self.pool_started = True
            self.pool.start()

    def __call__(self, env_steps: int, policy) -> None:
        if self.due(env_steps):
            self.start_pool()
            self.runner.trigger(env_steps, policy)
        if (result := self.runner.poll()) is not None:
            self.report(result)
        self.pool.poll()

    def report(self, result: EvalResult) -> None:
        metrics = result.metrics()
        self.writer.write(result.step, {"env_steps": result.step, **metrics})
        log.info(
            "eval at env step %d: return %.2f over %d episodes",
            result.step,
            metrics["eval/return"],
            metrics["eval/episodes"],
        )
        parts = self.parts
        submit_reports(
            self.pool, self.logdir, result, self.cfg, parts.agent, parts.replay, self.runner.image
        )

    def close(self, finished: bool) -> None:
        """At the run's end (``finished``) the evaluation in flight is waited for."""
        if finished and (result := self.runner.finish()) is not None:
            self.report(result)
        self.runner.shutdown(wanted=finished)
        self.pool.close()

    def state_dict(self) -> dict:
        return self.runner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.runner.load_state_dict(state)
