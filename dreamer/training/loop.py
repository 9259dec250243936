"""A training run from its config: the run directory taken (rank 0), the parts built,
the loop (``train``), the clean-up and the line that says how it ended. Everything
here needs torch; ``dreamer.train`` reads the command line without it."""

from __future__ import annotations

import contextlib
import logging
import shlex
import shutil
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from dreamer.agent.spaces import spaces_to_dict
from dreamer.data.collect import CollectorError, pace_mode, path_note
from dreamer.envs import registry
from dreamer.errors import ConfigError
from dreamer.evaluation.periodic import PeriodicEvaluation
from dreamer.learning.learner import CompileNote, NonFiniteError, describe, learner_threads
from dreamer.outputs import metric_keys
from dreamer.outputs.logs import (
    IntervalMeans,
    MetricsWriter,
    OutputError,
    Progress,
    Rates,
    setup_logging,
)
from dreamer.runtime import checkpoint, signals
from dreamer.runtime.cores import usable_cores
from dreamer.runtime.dist import process_group
from dreamer.runtime.heap import frozen_heap
from dreamer.runtime.lock import RunLock, RunLockedError
from dreamer.runtime.malloc import keep_freed_memory
from dreamer.runtime.openmp import chosen_wait_policy
from dreamer.runtime.schedules import Clock
from dreamer.runtime.signals import StopSignals
from dreamer.runtime.timing import CpuSpeedNote, LoopTimers, StartLine
from dreamer.runtime.world import World
from dreamer.training.parts import build_parts
from dreamer.training.resume import resolved_logdir, with_logdir
from dreamer.training.rundir import make_run_dir, prepare_run_dir

log = logging.getLogger("dreamer")


def run(argv: list[str], cfg: DictConfig, build=None) -> int:
    """Returns 0 when done, REQUEUE_EXIT after SIGTERM/SIGUSR1 (checkpointed), 2 on a user
    error; Ctrl-C checkpoints and raises KeyboardInterrupt. Every rank runs this; rank 0
    alone owns the run directory and the others start from its checkpoint."""
    world = World.from_environment()
    setup_logging(world.rank)
    signals.quiet_handshake_resets()
    created: list[Path] = []  # the run directory and the parents made for it
    try:
        device = world.device(cfg.learner.device)
        with process_group(world, device, cfg.learner.dist_timeout):
            logdir = Path(world.broadcast_object(str(resolved_logdir(cfg))))  # rank 0's
            cfg = with_logdir(cfg, logdir)
            if world.main:
                created = [p for p in (logdir, *logdir.parents) if not p.exists()]
                make_run_dir(logdir)
            with RunLock(logdir) if world.main else contextlib.nullcontext():
                state = prepare_run_dir(cfg, logdir) if world.main else None
                world.barrier()  # rank 0 has checked the run directory and saved the config
                if not world.main:
                    state = checkpoint.newest_good(logdir)[1]
                try:
                    code = train(cfg, logdir, state, world, device, build or build_parts)
                    if code == signals.REQUEUE_EXIT and world.main:
                        log.info("resume it with: %s", resume_command(argv, logdir))
                    return code
                except KeyboardInterrupt:
                    log.info(
                        "interrupted: checkpoint written; resume it with: %s",
                        resume_command(argv, logdir),
                    )
                    raise
    except (ConfigError, RunLockedError, checkpoint.CheckpointError) as error:
        if created:  # refused before any training: leave no half-created run directory
            shutil.rmtree(created[0], ignore_errors=True)
            for parent in created[1:]:
                with contextlib.suppress(OSError):  # another run may have made it since
                    parent.rmdir()
        print(f"error: {_ranked(world, error)}", file=sys.stderr)
        return 2
    except (NonFiniteError, CollectorError, OutputError, checkpoint.SaveFailures) as error:
        print(f"error: {_ranked(world, error)}", file=sys.stderr)
        return 1


def _ranked(world: World, error: Exception) -> str:
    return f"rank {world.rank}: {error}" if world.distributed else str(error)


def train(cfg, logdir: Path, resume: dict | None, world: World, device, build=build_parts) -> int:
    """The loop. ``build`` makes the run's parts (``dreamer.training.parts.build_parts``)."""
    parts, pace = set_up(cfg, logdir, resume, world, device, build)
    learner, replay, steps, collector = parts.learner, parts.replay, parts.steps, parts.collector
    policy = parts.agent.policy
    start = steps.env_steps
    if start >= cfg.run.steps:
        log.info("nothing to do: %d env steps already done (run.steps=%d)", start, cfg.run.steps)
        return 0
    writer = announce(cfg, parts, pace, logdir, world, device)
    speed_note = CpuSpeedNote(cfg, world.main and device.type == "cpu", start)
    extras = {"config": OmegaConf.to_container(cfg), "spaces": spaces_to_dict(parts.spaces)}
    save = checkpoint.Saver(logdir, parts.registry, extras, cfg.run.keep, cfg.run.save_failures)
    losses, timers, under_way = IntervalMeans(), LoopTimers(learner.updates), StartLine()
    compiled = CompileNote(learner.modes["compile"])
    alone = not world.distributed  # acts on its own stop signal at once; ranks at the lockstep
    evaluation = progress = None
    finished = failed_output = stopping = False  # failed_output: a full disk
    # from here a stop (a signal, Ctrl-C) ends with a checkpoint, whatever is starting
    with StopSignals() as stop:
        try:
            collector.start()
            evaluation = periodic_evaluation(cfg, logdir, parts, writer, resume, world)
            should_log = RowClock(cfg.run.log_every, cfg.run.log_seconds, cfg.run.steps, start)
            should_save = Clock(cfg.run.save_every, time.monotonic())
            should_push = Clock.aligned(cfg.collector.sync_every, learner.updates)
            rates = Rates(start, learner.updates)
            progress = Progress(
                cfg.run.steps, start, cfg.run.progress and world.main, learner.updates
            )
            with frozen_heap(freeze=cfg.run.gc_freeze) as gc_stats:
                for _ in timers.waiting(collector):
                    under_way.transitions()
                    env_steps, stopping, ready = steps(
                        parts.episodes.worker_steps, bool(stop.received), replay.can_sample()
                    )
                    due = parts.train_ratio(env_steps, ready)
                    progress.expect(learner.updates + due + parts.train_ratio.left(cfg.run.steps))
                    with collector.paced(due > 0):
                        for _ in range(due):
                            with timers.phase("sample"):
                                batch = replay.sample()
                            compiled.before_update()
                            started = time.perf_counter()
                            with signals.ctrl_c_after_block():
                                losses.add(learner.update(batch))
                            timers.add("update", seconds := time.perf_counter() - started)
                            compiled.after_update(seconds)
                            speed_note(seconds)
                            under_way.updated(env_steps)
                            progress.update(env_steps, learner.updates)
                            if should_push(learner.updates):
                                with timers.phase("sync"):
                                    collector.push(policy, cfg.collector.push_timeout)
                            if alone and stop.received:
                                break
                    progress.update(env_steps, learner.updates)
                    if evaluation is not None:  # before the save: it holds the one in flight
                        with timers.phase("eval"):
                            evaluation(env_steps, policy)
                    with timers.phase("log"):
                        if world.main and should_log(env_steps):
                            row = {"env_steps": env_steps, "timestamp": should_log.timestamp}
                            row |= rates(env_steps, learner.updates)
                            values = metrics(parts, losses, gc_stats, timers, should_log.last[1])
                            writer.write(env_steps, row | values)
                        if world.main and should_save(time.monotonic()):
                            save(env_steps)
                    stopping = stopping or (alone and bool(stop.received))
                    if env_steps >= cfg.run.steps or stopping:
                        break
            finished = not stopping
        except (OutputError, checkpoint.SaveFailures):
            # a full disk: a checkpoint now could hold steps whose row was never written
            failed_output = True
            raise
        finally:
            collector.shutdown()
            if progress is not None:
                progress.close()
            saved = save.final(steps.env_steps) if world.main and not failed_output else True
            if evaluation is not None:
                evaluation.close(finished)  # waited for if the run finished
            if writer is not None:
                writer.close()
            log.info(timers.summary())
    return outcome(saved, finished, stop.received, parts, logdir, world)


def set_up(cfg, logdir: Path, resume: dict | None, world: World, device, build):
    """The run's parts, built and restored, with the learner's threads set; (parts, pace)."""
    pace = pace_mode(cfg.collector.pace, device.type == "cpu")
    collectors = cfg.run.envs // cfg.collector.envs_per_worker + 1  # + the inference process
    torch.set_num_threads(learner_threads(cfg.learner.threads, device, pace != "none", collectors))
    parts = build(cfg, logdir, world, device, pace=pace)
    parts.restore(cfg, resume, world)
    return parts, pace


def announce(cfg, parts, pace: str, logdir: Path, world: World, device) -> MetricsWriter | None:
    """The start line and the collection's speed note; returns rank 0's metrics writer."""
    if world.main and (note := path_note(bool(parts.spaces.image_keys))):
        log.info(note)
    writer = MetricsWriter(cfg, logdir, parts.steps.env_steps) if world.main else None
    log.info(
        "training %s on %s (update: %s; learner: %d torch threads of %d usable cores, "
        "OpenMP %s, malloc %s; collection pace while it updates: %s), logging to %s",
        cfg.model.name,
        registry.label(cfg.env),
        describe(cfg.learner, parts.learner.modes, device),
        torch.get_num_threads(),
        usable_cores(),
        " ".join(f"{k}={v}" for k, v in chosen_wait_policy().items()) or "as the env sets it",
        "keeps freed memory" if keep_freed_memory() else "as glibc or the environment sets it",
        pace,
        logdir,
    )
    return writer


def periodic_evaluation(cfg, logdir: Path, parts, writer, resume: dict | None, world: World):
    """Rank 0's evaluations, checkpointed with the run; None when none is due."""
    if not (world.main and 0 < cfg.eval.every <= cfg.run.steps):
        return None
    evaluation = PeriodicEvaluation(cfg, logdir, parts, writer, parts.steps.env_steps)
    evaluation.resume(resume)
    parts.registry.register("evaluation", evaluation)
    return evaluation


class RowClock:
    """When the loop writes a metrics row: every ``every`` env steps (aligned), at
    ``run.steps``, and once ``seconds`` passed without one (CPU runs' rows can be hours apart)."""

    def __init__(self, every: int, seconds: float, end: int, start: int):
        self.aligned, self.seconds, self.end = Clock.aligned(every, start), seconds, end
        self.last = (start, time.perf_counter())  # env step and time of the last row
        self.timestamp = time.time()  # the last row's, in Unix seconds

    def __call__(self, env_steps: int) -> bool:
        now = time.perf_counter()
        overdue = now - self.last[1] >= self.seconds and env_steps > self.last[0]
        if self.aligned(env_steps) or env_steps >= self.end or overdue:
            self.last = (env_steps, now)  # the row's interval ends here (LoopTimers.flush)
            self.timestamp = time.time()
            return True
        return False


def metrics(parts, losses: IntervalMeans, gc_stats, timers: LoopTimers, at: float) -> dict:
    """A metrics row's values besides the env step and the rates (docs/outputs.md); its
    interval ends ``at`` (``time.perf_counter``): gathering them counts in the next row's."""
    learner = parts.learner
    return {
        "updates": learner.updates,
        "replay/size": len(parts.replay),
        "policy_version": parts.collector.policy_version,
        "learner/skipped": learner.optimizer.skipped,
        **metric_keys.logged(losses.flush()),
        **parts.episodes.flush(),
        **parts.relaunches.metrics(),
        **gc_stats.metrics(),
        **timers.flush(learner.updates, at),
    }


def outcome(saved: bool, finished: bool, received, parts, logdir: Path, world: World) -> int:
    """The exit code and its line: done (0), stopped by a signal (REQUEUE_EXIT, and a
    ``stopped`` file) or the final checkpoint lost (1)."""
    if not saved:
        log.error("the final checkpoint could not be written; a rerun resumes from the last one")
        return 1
    env_steps = parts.steps.env_steps
    if not finished:
        message = f"stopped by signal {received or '(on another rank)'} at env step {env_steps}"
        if world.main:
            (logdir / signals.STOPPED_FILE).write_text(message + "\n")
        log.info("%s", message)
        return signals.REQUEUE_EXIT
    log.info("done: %d env steps, %d updates", env_steps, parts.learner.updates)
    return 0


def resume_command(argv: list[str], logdir: Path) -> str:
    """``argv`` with ``run.logdir`` set to ``logdir``: the command that continues the run,
    run by this interpreter's path (a bare ``python`` outside the venv has no torch)."""
    kept = [arg for arg in argv if not arg.startswith("run.logdir=")]
    interpreter = sys.executable or "python"
    return shlex.join([interpreter, "-m", "dreamer.train", *kept, f"run.logdir={logdir.resolve()}"])
