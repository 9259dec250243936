"""``python -m dreamer.train [overrides]``: set up, run the loop, clean up."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torchrl.trainers.algorithms import DreamerV3UpdateRatio

from dreamer import checkpoint
from dreamer.agent.build import build_agent, latent_sizes
from dreamer.agent.spaces import spaces_from_env, spaces_to_dict
from dreamer.checkpoint import RunLock, RunLockedError, StopSignals
from dreamer.collect import Collection, CollectorError, make_collector, path_note
from dreamer.config import ConfigError, check_resume, from_argv
from dreamer.dist import Lockstep, World, process_group
from dreamer.envs import action_note, env_config, make_env
from dreamer.episodes import EpisodeStats
from dreamer.evaluation import EvalResult, EvalRunner
from dreamer.heap import frozen_heap
from dreamer.learner import Learner, NonFiniteError
from dreamer.logs import MetricsWriter, Progress, setup_logging
from dreamer.relaunches import Relaunches
from dreamer.render import RenderPool, pool_size
from dreamer.replay import SequenceReplay
from dreamer.reports import submit_reports
from dreamer.timing import LoopTimers
from dreamer.warmstart import warm_start

log = logging.getLogger("dreamer")
REPLACEMENT_SEED_STRIDE = 7_919  # env seeds of a replacement collector's workers
SPEED_SAMPLE = 5  # updates timed for the CPU speed note
SHARED_PARTS = ("learner", "ratio", "steps")  # what ranks > 0 take from rank 0's checkpoint


class Every:
    """Is it time yet? True once per ``period`` of a growing counter."""

    def __init__(self, period: float, start: float = 0):
        self.period = period
        self.next = start + period

    def __call__(self, value: float) -> bool:
        if value < self.next:
            return False
        while self.next <= value:
            self.next += self.period
        return True


def describe_env(env: dict, seed: int) -> tuple:
    try:
        probe = make_env(env, seed)
    except ConfigError:
        raise
    except Exception as error:  # a broken env: one line, before any worker starts
        what = env["id"] if env["name"] == "gym" else env["name"]
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"env: cannot create {what}: {detail}") from error
    try:
        try:
            spaces = spaces_from_env(probe)
        except ValueError as error:
            raise ConfigError(f"env: {error}") from None
        if note := action_note(probe):
            log.warning(note)
    finally:
        probe.close()
    achievements = ()
    if env["name"] == "crafter":
        from dreamer.envs.crafter import ACHIEVEMENTS

        achievements = ACHIEVEMENTS
    return spaces, achievements


def cpu_speed_note(seconds_per_update: float, cfg) -> str:
    updates = cfg.run.steps * cfg.run.train_ratio / (cfg.replay.batch * cfg.replay.length)
    hours = updates * seconds_per_update / 3600
    return (
        f"no GPU: a learner update takes {seconds_per_update:.2f} s on this CPU (median of "
        f"the first {SPEED_SAMPLE}); "
        f"run.steps={cfg.run.steps} needs ~{updates:,.0f} updates = ~{hours:,.1f} h of "
        "learner time. For a quick end-to-end check run `make smoke`."
    )


def has_eval_row(logdir: Path, step: int) -> bool:
    """Has metrics.jsonl the evaluation row of env step ``step``?"""
    path = logdir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:  # cut short by a crash
            continue
        if row.get("env_steps") == step and "eval/return" in row:
            return True
    return False


def prepare_run_dir(cfg, logdir: Path) -> dict | None:
    """Check a run directory for resuming; returns the checkpoint state, if any.

    Metrics lines past the checkpoint are dropped so a resumed run has no duplicated
    or missing steps; a changed config outside the resumable keys is refused."""
    saved_config = logdir / "config.yaml"
    if saved_config.exists():
        check_resume(OmegaConf.to_container(OmegaConf.load(saved_config)), cfg)
    (logdir / checkpoint.STOPPED_FILE).unlink(missing_ok=True)  # a stop of an earlier run
    for partial in checkpoint.remove_partial(logdir):
        log.warning("removed %s, a checkpoint write a crash interrupted", partial.name)
    found = checkpoint.latest(logdir)
    state = checkpoint.load(found) if found else None
    MetricsWriter.truncate(logdir, state["steps"]["env_steps"] if state else 0)
    OmegaConf.save(cfg, saved_config, resolve=True)
    if state:
        log.info("resuming from %s at env step %d", found.name, state["steps"]["env_steps"])
    return state


def main(argv: list[str] | None = None) -> int:
    """Returns 0 when done, REQUEUE_EXIT after SIGTERM/SIGUSR1 (checkpointed);
    Ctrl-C checkpoints and raises KeyboardInterrupt; user errors exit 2.

    Under torchrun every rank runs this; rank 0 alone owns the run directory (lock,
    config, metrics, checkpoints) and the others start from its checkpoint."""
    cfg = from_argv(sys.argv[1:] if argv is None else argv)
    world = World.from_environment()
    setup_logging(world.rank)
    device = world.device(cfg.learner.device)
    created = False
    try:
        with process_group(world, device, cfg.learner.dist_timeout):
            logdir = Path(world.broadcast_object(cfg.run.logdir))  # rank 0's default timestamp
            if world.main:
                created = not logdir.exists()
                logdir.mkdir(parents=True, exist_ok=True)
            with RunLock(logdir) if world.main else contextlib.nullcontext():
                state = prepare_run_dir(cfg, logdir) if world.main else None
                world.barrier()  # rank 0 has checked the run directory and saved the config
                if not world.main:
                    state = checkpoint.latest_state(logdir)
                return train(cfg, logdir, state, world, device)
    except (ConfigError, RunLockedError) as error:
        if created:  # refused before any training: leave no half-created run directory
            shutil.rmtree(logdir, ignore_errors=True)
        print(f"error: {_ranked(world, error)}", file=sys.stderr)
        return 2
    except (NonFiniteError, CollectorError) as error:
        print(f"error: {_ranked(world, error)}", file=sys.stderr)
        return 1


def _ranked(world: World, error: Exception) -> str:
    return f"rank {world.rank}: {error}" if world.distributed else str(error)


def train(cfg, logdir: Path, resume: dict | None, world: World, device: torch.device) -> int:
    if cfg.learner.threads:
        torch.set_num_threads(cfg.learner.threads)
    env = env_config(OmegaConf.to_container(cfg.env), logdir)
    spaces, achievements = describe_env(env, cfg.run.seed)
    model, learner_cfg = OmegaConf.to_container(cfg.model), OmegaConf.to_container(cfg.learner)
    torch.manual_seed(cfg.run.seed)  # the inference process builds the same weights
    agent = build_agent(cfg.model, cfg.learner, spaces, world.size)
    latent = latent_sizes(cfg.model)
    learner = Learner(agent, cfg.learner, device, world)
    obs_names = [key.name for key in spaces.obs]
    replay = SequenceReplay.from_config(cfg, obs_names, logdir, world.rank, world.size)
    stats = EpisodeStats(achievements)  # this rank's env workers
    lockstep = Lockstep(world, device)  # env steps of all ranks
    # replay.batch is the whole job's batch (each rank samples its share), so the
    # schedule reads the same at any world size
    ratio = DreamerV3UpdateRatio(cfg.run.train_ratio / (cfg.replay.batch * cfg.replay.length))

    def new_collector(replacements: int):
        """The first collector, or a replacement after a dead worker (counted as an env
        restart; its workers get fresh env seeds)."""
        if replacements:
            stats.restarts += 1
        collector = make_collector(
            env=env,
            model=model,
            learner=learner_cfg,
            spaces=spaces,
            latent=latent,
            envs=cfg.run.envs // world.size,
            collector=OmegaConf.to_container(cfg.collector),
            seed=cfg.run.seed + REPLACEMENT_SEED_STRIDE * replacements,
            replay=replay,
            total=cfg.run.steps - lockstep.env_steps,  # the loop stops at run.steps before
            rank=world.rank,
            gpu=str(world.device("cuda")),  # this rank's GPU, for static-batch inference
        )
        collector.post_collect_hook = stats
        collector.update_policy_weights_(agent.policy)
        return collector

    note = path_note(bool(spaces.image_keys))
    if note and world.main:
        log.warning(note)
    relaunches = Relaunches()  # of the inference, evaluation and render processes
    collection = Collection(new_collector, relaunches=relaunches)
    registry = checkpoint.Registry()
    for name, part in (
        ("learner", learner),
        ("ratio", ratio),
        ("steps", lockstep),
        ("episodes", stats),
        ("replay", replay),
        ("collection", collection),
        ("relaunches", relaunches),
        ("rng", checkpoint.TorchRng()),
    ):
        registry.register(name, part)
    if resume:  # other ranks keep their own workers' parts (replay shard, episodes, rng)
        registry.load_state_dict(resume, None if world.main else SHARED_PARTS)
    elif cfg.run.from_checkpoint:  # a new run from another run's weights (every rank alike)
        parts = list(cfg.run.from_checkpoint_parts)
        warm_start(learner, agent, spaces, model, cfg.run.from_checkpoint, parts)
    lockstep.start(stats.env_steps)
    start = lockstep.env_steps
    if start >= cfg.run.steps:
        log.info("nothing to do: %d env steps already done (run.steps=%d)", start, cfg.run.steps)
        return 0
    collection.start()
    metrics_writer = MetricsWriter.from_config(cfg, logdir) if world.main else None
    evaluation, pool = None, None
    if world.main and 0 < cfg.eval.every <= cfg.run.steps:  # an evaluation is due
        evaluation = EvalRunner.from_config(cfg, env, spaces, achievements, relaunches)
        pool = RenderPool(
            pool_size(cfg.eval.render_workers), relaunches, on_file=metrics_writer.log_file
        )
        pool.start()
        registry.register("evaluation", evaluation)
        in_flight = (resume or {}).get("evaluation") or {"step": None}
        if in_flight["step"] is not None and not has_eval_row(logdir, in_flight["step"]):
            evaluation.load_state_dict(in_flight)  # lost with the process that ran it
        eval_due = Every(cfg.eval.every, start - start % cfg.eval.every)
    progress = Progress(cfg.run.steps, initial=start, enabled=cfg.run.progress and world.main)
    log_due = Every(cfg.run.log_every, start - start % cfg.run.log_every)
    save_due = Every(cfg.run.save_every, time.monotonic())
    losses: dict[str, float] = {}
    first_updates: list[float] = []
    interval = {"time": time.perf_counter(), "steps": start, "updates": learner.updates}

    def write_metrics() -> None:
        now = time.perf_counter()
        elapsed = max(now - interval["time"], 1e-9)
        row = {
            "env_steps": lockstep.env_steps,
            "updates": learner.updates,
            "env_steps_per_s": (lockstep.env_steps - interval["steps"]) / elapsed,
            "updates_per_s": (learner.updates - interval["updates"]) / elapsed,
            "replay/size": len(replay),
            "policy_version": collection.policy_version,
            **losses,
            **stats.flush(),
            **relaunches.metrics(),
            **gc_stats.metrics(),
            **timers.flush(),
        }
        metrics_writer.write(lockstep.env_steps, row)
        interval.update(time=now, steps=lockstep.env_steps, updates=learner.updates)

    def report(result: EvalResult) -> None:
        """Log an evaluation's metrics and queue its reports on the render pool."""
        metrics = result.metrics()
        metrics_writer.write(result.step, {"env_steps": result.step, **metrics})
        log.info(
            "eval at env step %d: return %.2f over %d episodes",
            result.step,
            metrics["eval/return"],
            metrics["eval/episodes"],
        )
        submit_reports(pool, logdir, result, cfg, agent, replay, evaluation.image)

    def save() -> bool:
        state = registry.state_dict() | {
            "config": OmegaConf.to_container(cfg),
            "spaces": spaces_to_dict(spaces),  # the layout Policy.load and warm starts need
        }
        try:
            path = checkpoint.save(logdir, lockstep.env_steps, state, keep=cfg.run.keep)
        except checkpoint.CheckpointError as error:
            log.error("%s; the previous checkpoint is kept, retrying at the next interval", error)
            return False
        log.info("checkpoint written: %s", path)
        return True

    def push_weights() -> None:
        """The learner's weights to the inference process, waiting at most
        ``collector.push_timeout`` s; a starved one (an overloaded machine) gets them at
        the next push. A dead one is replaced with its collector when the collector
        reports it."""
        try:
            collection.push(agent.policy, cfg.collector.push_timeout)
        except TimeoutError as error:
            log.warning(
                "weight push: %s (waited %.0f s); the policy keeps its weights until the next push",
                error,
                cfg.collector.push_timeout,
            )
        except RuntimeError as error:
            if collection.server_alive():
                raise
            log.warning("weight push failed, the inference server is gone: %s", error)

    log.info("training %s on %s, logging to %s", cfg.model.name, cfg.env.name, logdir)
    timers = LoopTimers()
    finished = False  # reached run.steps: a pending evaluation is waited for
    stopping = False  # a stop signal reached some rank
    time_first_updates = world.main and device.type == "cpu"

    def stop_alone() -> bool:
        """One rank acts on its own signal at once; ranks of a job stop at the lockstep."""
        return not world.distributed and bool(stop.received)

    try:
        with StopSignals() as stop, frozen_heap(freeze=cfg.run.gc_freeze) as gc_stats:
            for _ in timers.waiting(collection):
                steps, stopping, ready = lockstep(
                    stats.env_steps, bool(stop.received), replay.can_sample()
                )
                if steps >= cfg.run.train_starts and ready:
                    for _ in range(ratio(steps)):
                        with timers.phase("sample"):
                            batch = replay.sample()
                        started = time.perf_counter()
                        losses = learner.update(batch)
                        timers.add("update", time.perf_counter() - started)
                        if time_first_updates and len(first_updates) < SPEED_SAMPLE:
                            first_updates.append(time.perf_counter() - started)
                            if len(first_updates) == SPEED_SAMPLE:  # the 1st one is slower
                                log.info(cpu_speed_note(statistics.median(first_updates), cfg))
                        if learner.updates % cfg.collector.sync_every == 0:
                            with timers.phase("sync"):
                                push_weights()
                        if stop_alone():
                            break
                progress.update(steps, learner.updates)
                with timers.phase("log"):
                    if world.main and (log_due(steps) or steps >= cfg.run.steps):
                        write_metrics()
                    if world.main and save_due(time.monotonic()):
                        save()
                if evaluation is not None:
                    with timers.phase("eval"):
                        if eval_due(steps):
                            evaluation.trigger(steps, agent.policy)
                        if (result := evaluation.poll()) is not None:
                            report(result)
                        pool.poll()
                stopping = stopping or stop_alone()
                if steps >= cfg.run.steps or stopping:
                    break
            finished = not stopping
    finally:
        collection.shutdown()
        progress.close()
        saved = save() if world.main else True
        if evaluation is not None:
            if finished and (result := evaluation.finish()) is not None:
                report(result)
            evaluation.shutdown()
            pool.close()
        if metrics_writer is not None:
            metrics_writer.close()
        log.info(timers.summary())
    if not saved:
        log.error("the final checkpoint could not be written; a rerun resumes from the last one")
        return 1
    if not finished:
        message = (
            f"stopped by signal {stop.received or '(on another rank)'} "
            f"at env step {lockstep.env_steps}"
        )
        if world.main:
            (logdir / checkpoint.STOPPED_FILE).write_text(message + "\n")
        log.info("%s; rerun to resume", message)
        return checkpoint.REQUEUE_EXIT
    log.info("done: %d env steps, %d updates", lockstep.env_steps, learner.updates)
    return 0


def cli() -> int:
    if {"-m", "--multirun"} & set(sys.argv[1:]):  # a sweep: Hydra runs main() per job
        from dreamer import sweep

        return sweep.main(sys.argv[1:])
    try:
        return main()
    except KeyboardInterrupt:
        log.info("interrupted: checkpoint written; rerun with the same run.logdir to resume")
        return checkpoint.INTERRUPT_EXIT


if __name__ == "__main__":
    sys.exit(cli())
