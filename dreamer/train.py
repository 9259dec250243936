"""``python -m dreamer.train [overrides]``: set up, run the loop, clean up."""

from __future__ import annotations

# before anything imports torch: libgomp reads its settings when torch loads it
from dreamer.runtime.openmp import choose_wait_policy

OPENMP = choose_wait_policy()

import contextlib
import logging
import shlex
import shutil
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dreamer.agent.spaces import spaces_to_dict
from dreamer.data.collect import CollectorError, pace_mode, path_note
from dreamer.data.replay import random_batch
from dreamer.envs import registry
from dreamer.errors import ConfigError
from dreamer.evaluation.periodic import PeriodicEvaluation
from dreamer.key_reference import from_argv
from dreamer.learning.learner import NonFiniteError, describe, learner_threads
from dreamer.outputs import metric_keys
from dreamer.outputs.logs import (
    IntervalMeans,
    MetricsWriter,
    OutputError,
    Progress,
    Rates,
    setup_logging,
)
from dreamer.outputs.trackers import check_installed
from dreamer.runtime import checkpoint, signals
from dreamer.runtime.cores import usable_cores
from dreamer.runtime.dist import World, process_group
from dreamer.runtime.heap import frozen_heap
from dreamer.runtime.lock import RunLock, RunLockedError
from dreamer.runtime.malloc import keep_freed_memory
from dreamer.runtime.schedules import Clock
from dreamer.runtime.signals import StopSignals
from dreamer.runtime.timing import CpuSpeedNote, LoopTimers
from dreamer.training.parts import build_parts
from dreamer.training.rundir import make_run_dir, prepare_run_dir

log = logging.getLogger("dreamer")


def main(argv: list[str] | None = None, build=build_parts, cfg=None) -> int:
    """Returns 0 when done, REQUEUE_EXIT after SIGTERM/SIGUSR1 (checkpointed);
    Ctrl-C checkpoints and raises KeyboardInterrupt; user errors exit 2.

    Under torchrun every rank runs this; rank 0 alone owns the run directory (lock,
    config, metrics, checkpoints) and the others start from its checkpoint."""
    argv = sys.argv[1:] if argv is None else argv
    if cfg is None:  # a sweep's job passes the config its launcher composed
        cfg = from_argv(argv)
    world = World.from_environment()
    setup_logging(world.rank)
    signals.quiet_handshake_resets()
    created: list[Path] = []  # the run directory and the parents made for it
    try:
        device = world.device(cfg.learner.device)
        with process_group(world, device, cfg.learner.dist_timeout):
            logdir = Path(world.broadcast_object(cfg.run.logdir))  # rank 0's default timestamp
            if world.main:
                created = [p for p in (logdir, *logdir.parents) if not p.exists()]
                make_run_dir(logdir)
            with RunLock(logdir) if world.main else contextlib.nullcontext():
                state = prepare_run_dir(cfg, logdir) if world.main else None
                world.barrier()  # rank 0 has checked the run directory and saved the config
                if not world.main:
                    state = checkpoint.latest_state(logdir)
                try:
                    code = train(cfg, logdir, state, world, device, build)
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
    check_installed(cfg.logger.use)
    pace = pace_mode(cfg.collector.pace, device.type == "cpu")
    collectors = cfg.run.envs // cfg.collector.envs_per_worker + 1  # + the inference process
    torch.set_num_threads(learner_threads(cfg.learner.threads, device, pace != "none", collectors))
    parts = build(cfg, logdir, world, device, pace=pace)
    parts.restore(cfg, resume, world)
    agent, learner, replay, steps, collector = (
        parts.agent,
        parts.learner,
        parts.replay,
        parts.steps,
        parts.collector,
    )
    start = steps.env_steps
    if start >= cfg.run.steps:
        log.info("nothing to do: %d env steps already done (run.steps=%d)", start, cfg.run.steps)
        return 0
    if world.main and (note := path_note(bool(parts.spaces.image_keys))):
        log.info(note)  # a note on speed, not a problem with this run
    writer = MetricsWriter.from_config(cfg, logdir) if world.main else None
    log.info(
        "training %s on %s (update: %s; learner: %d torch threads of %d usable cores, "
        "OpenMP %s, malloc %s; collection pace while it updates: %s), logging to %s",
        cfg.model.name,
        registry.label(cfg.env),
        describe(cfg.learner, learner.modes, device),
        torch.get_num_threads(),
        usable_cores(),
        " ".join(f"{k}={v}" for k, v in OPENMP.items()) or "as the environment sets it",
        "keeps freed memory" if keep_freed_memory() else "as glibc or the environment sets it",
        pace,
        logdir,
    )
    speed_note = CpuSpeedNote(cfg, world.main and device.type == "cpu", start)
    early, interrupted = estimate_at_start(speed_note, learner, parts.spaces, cfg, world)
    collector.start()
    evaluation = None
    if world.main and 0 < cfg.eval.every <= cfg.run.steps:  # an evaluation is due
        evaluation = PeriodicEvaluation(cfg, logdir, parts, writer, start)
        evaluation.resume(resume)
        parts.registry.register("evaluation", evaluation)
    # the layout Policy.load and warm starts need
    extras = {"config": OmegaConf.to_container(cfg), "spaces": spaces_to_dict(parts.spaces)}
    save = checkpoint.Saver(logdir, parts.registry, extras, cfg.run.keep, cfg.run.save_failures)
    should_log = Clock.aligned(cfg.run.log_every, start)
    last_row = (start, time.monotonic())  # env step and time of the last metrics row
    should_save = Clock(cfg.run.save_every, time.monotonic())
    should_push = Clock.aligned(cfg.collector.sync_every, learner.updates)
    losses, rates, timers = (
        IntervalMeans(),
        Rates(start, learner.updates),
        LoopTimers(learner.updates),
    )
    progress = Progress(
        cfg.run.steps,
        start,
        enabled=cfg.run.progress and world.main,
        updates=learner.updates,
        seconds_per_update=speed_note.started,
    )
    alone = not world.distributed  # acts on its own stop signal at once; ranks at the lockstep
    finished = False  # reached run.steps: a pending evaluation is waited for
    failed_output = False  # a run output could not be written (a full disk)
    stopping = False  # a stop signal reached some rank
    try:
        with StopSignals() as stop, frozen_heap(freeze=cfg.run.gc_freeze) as gc_stats:
            stop.received = stop.received or early.received
            if interrupted:
                raise KeyboardInterrupt
            for _ in timers.waiting(collector):
                env_steps, stopping, ready = steps(
                    parts.episodes.worker_steps, bool(stop.received), replay.can_sample()
                )
                due = parts.train_ratio(env_steps, ready)
                progress.expect(learner.updates + due + parts.train_ratio.left(cfg.run.steps))
                with collector.paced(due > 0):
                    for _ in range(due):
                        with timers.phase("sample"):
                            batch = replay.sample()
                        started = time.perf_counter()
                        with signals.ctrl_c_after_block():
                            losses.add(learner.update(batch))
                        timers.add("update", seconds := time.perf_counter() - started)
                        speed_note(seconds)
                        progress.update(env_steps, learner.updates)
                        if should_push(learner.updates):
                            with timers.phase("sync"):
                                collector.push(agent.policy, cfg.collector.push_timeout)
                        if alone and stop.received:
                            break
                progress.update(env_steps, learner.updates)
                if evaluation is not None:  # before the save: it holds the one now in flight
                    with timers.phase("eval"):
                        evaluation(env_steps, agent.policy)
                with timers.phase("log"):
                    overdue = time.monotonic() - last_row[1] >= cfg.run.log_seconds
                    if world.main and (
                        should_log(env_steps)
                        or env_steps >= cfg.run.steps
                        or (overdue and env_steps > last_row[0])
                    ):
                        last_row = (env_steps, time.monotonic())
                        row = {
                            "env_steps": env_steps,
                            "updates": learner.updates,
                            **rates(env_steps, learner.updates),
                            "replay/size": len(replay),
                            "policy_version": collector.policy_version,
                            "learner/skipped": learner.optimizer.skipped,
                            **metric_keys.logged(losses.flush()),
                            **parts.episodes.flush(),
                            **parts.relaunches.metrics(),
                            **gc_stats.metrics(),
                            **timers.flush(learner.updates),
                        }
                        writer.write(env_steps, row)
                    if world.main and should_save(time.monotonic()):
                        save(env_steps)
                stopping = stopping or (alone and bool(stop.received))
                if env_steps >= cfg.run.steps or stopping:
                    break
            finished = not stopping
    except (OutputError, checkpoint.SaveFailures):
        # the disk is full: the last good checkpoint (and the rows up to it) is where a
        # rerun resumes; a checkpoint now could hold steps whose row was never written
        failed_output = True
        raise
    finally:
        collector.shutdown()
        progress.close()
        saved = save.final(steps.env_steps) if world.main and not failed_output else True
        if evaluation is not None:
            evaluation.close(finished)
        if writer is not None:
            writer.close()
        log.info(timers.summary())
    if not saved:
        log.error("the final checkpoint could not be written; a rerun resumes from the last one")
        return 1
    if not finished:
        signal = stop.received or "(on another rank)"
        message = f"stopped by signal {signal} at env step {steps.env_steps}"
        if world.main:
            (logdir / signals.STOPPED_FILE).write_text(message + "\n")
        log.info("%s", message)
        return signals.REQUEUE_EXIT
    log.info("done: %d env steps, %d updates", steps.env_steps, learner.updates)
    return 0


def estimate_at_start(speed_note, learner, spaces, cfg, world: World) -> tuple[StopSignals, bool]:
    """Without a GPU, the run's estimate from updates timed before collection starts
    (not across ranks: each would wait for the others; not for a run without updates).
    Returns the stop signals that came meanwhile (the loop acts on them at once) and
    whether Ctrl-C cut it short (the learner is as it was: the loop checkpoints it)."""
    early = StopSignals()
    if not (speed_note.enabled and not world.distributed and speed_note.updates() > 0):
        return early, False
    batch = random_batch(spaces, cfg.replay.batch, cfg.replay.length)
    compiling = learner.modes["compile"]
    log.info(  # it takes up to a minute (a cold compile): the screen says what runs
        "timing the learner update before collection starts%s",
        ": the first compiles it (tens of seconds the first time on this machine, "
        "seconds once torch's compile cache holds it)"
        if compiling
        else "",
    )
    try:
        with early:
            first, quickest = learner.timed_update(batch)
            how = "the quickest of the updates timed before collection; the first took "
            how += f"{first:.1f} s{', compiling' if compiling else ''}"
            speed_note.start(quickest, how)
    except KeyboardInterrupt:
        return early, True
    return early, False


def resume_command(argv: list[str], logdir: Path) -> str:
    """The run's command line ``argv`` with ``run.logdir`` pointing at ``logdir``: what
    continues it (a rerun without it would start a new run directory). The interpreter
    is this one, by its path: pasted into a shell without the venv active, or outside
    ``make``, a bare ``python`` has no torch."""
    kept = [arg for arg in argv if not arg.startswith("run.logdir=")]
    interpreter = sys.executable or "python"
    return shlex.join([interpreter, "-m", "dreamer.train", *kept, f"run.logdir={logdir.resolve()}"])


def cli() -> int:
    if {"-m", "--multirun"} & set(sys.argv[1:]):  # a sweep: Hydra runs main() per job
        from dreamer.training import sweep

        return sweep.main(sys.argv[1:], main)
    try:
        with signals.terminal_job():
            return main()
    except KeyboardInterrupt:  # the run said where it stopped and how to resume it
        return signals.INTERRUPT_EXIT


if __name__ == "__main__":
    sys.exit(cli())
