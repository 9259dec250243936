"""A training run's parts, built from its config: the env's layout, the learner, the
replay, the self-healing collector and the counters, attached to one checkpoint."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from dreamer.agent.build import Agent, build_agent, latent_sizes
from dreamer.agent.spaces import EnvSpaces
from dreamer.data.collect import (
    SelfHealingCollector,
    check_machine,
    hand_start_weights,
    make_collector,
)
from dreamer.data.episodes import EpisodeStats
from dreamer.data.replay import SequenceReplay, action_heads, row_bytes
from dreamer.envs.make import env_config, probe_env
from dreamer.learning.learner import Learner
from dreamer.runtime import checkpoint
from dreamer.runtime.dist import Lockstep
from dreamer.runtime.relaunches import Relaunches
from dreamer.runtime.schedules import TrainRatio
from dreamer.runtime.world import World
from dreamer.training.warmstart import warm_start

log = logging.getLogger("dreamer")
REPLACEMENT_SEED_STRIDE = 7_919  # env seeds of a replacement collector's workers
SHARED_PARTS = ("learner", "ratio", "steps")  # what ranks > 0 take from rank 0's checkpoint


@dataclass
class TrainingParts:
    env: object  # the env config node as the workers get it
    spaces: EnvSpaces
    achievements: tuple[str, ...]
    agent: Agent
    learner: Learner
    replay: SequenceReplay
    episodes: EpisodeStats  # this rank's env workers
    steps: Lockstep  # the run's env steps, all ranks together
    train_ratio: TrainRatio
    collector: SelfHealingCollector
    relaunches: Relaunches  # of the inference, evaluation and render processes
    registry: checkpoint.Registry

    def restore(self, cfg, resume: dict | None, world: World) -> None:
        """A resumed run's state (other ranks keep their own workers' parts: replay
        shard, episodes, RNG), or a new run's warm start from another run's weights."""
        if resume:
            self.registry.load_state_dict(resume, None if world.main else SHARED_PARTS)
        elif cfg.run.from_checkpoint:
            parts = list(cfg.run.from_checkpoint_parts)
            warm_start(
                self.learner, self.agent, self.spaces, cfg.model, cfg.run.from_checkpoint, parts
            )


def build_parts(
    cfg, logdir: Path, world: World, device: torch.device, make_learner=Learner, pace="none"
) -> TrainingParts:
    """``pace``: the resolved ``collector.pace`` (``dreamer.data.collect.pace_mode``)."""
    check_machine(cfg.collector)
    env = env_config(cfg.env, logdir)
    spaces, achievements, sample = probe_env(env, cfg.run.seed, latent_sizes(cfg.model))
    torch.manual_seed(cfg.run.seed)  # a new run's weights (rank 0's reach every rank)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    learner = make_learner(agent, cfg.learner, device, world)
    obs_names = [key.name for key in spaces.obs]
    replay = SequenceReplay.from_config(
        cfg, obs_names, logdir, world.rank, world.size, heads=action_heads(spaces)
    )
    replay.check_room(cfg.run.steps // world.size, row_bytes(spaces))
    episodes = EpisodeStats(achievements)
    steps = Lockstep(world, device)
    train_ratio = TrainRatio(
        cfg.run.train_ratio, cfg.replay.batch, cfg.replay.length, cfg.run.train_starts
    )

    def new_collector(replacements: int):
        """The first collector, or a replacement after a dead worker (an env restart)."""
        if replacements:
            episodes.restarts += 1
        collector = make_collector(
            env=env,
            model=cfg.model,
            spaces=spaces,
            sample=sample,
            policy=agent.policy,
            envs=cfg.run.envs // world.size,
            collector=cfg.collector,
            seed=cfg.run.seed + REPLACEMENT_SEED_STRIDE * replacements,
            replay=replay,
            total=cfg.run.steps - steps.env_steps,  # the loop stops at run.steps before
            rank=world.rank,
            gpu=f"cuda:{world.local_rank}",  # this rank's GPU, for static-batch inference
        )
        collector.post_collect_hook = episodes
        hand_start_weights(collector, agent.policy)
        return collector

    relaunches = Relaunches()
    collector = SelfHealingCollector(new_collector, relaunches=relaunches, pace=pace)
    registry = checkpoint.Registry()
    for name, part in (
        ("learner", learner),
        ("ratio", train_ratio),
        ("steps", steps),
        ("episodes", episodes),
        ("replay", replay),
        ("collection", collector),
        ("relaunches", relaunches),
        ("rng", checkpoint.RngState()),
    ):
        registry.register(name, part)
    return TrainingParts(
        env,
        spaces,
        achievements,
        agent,
        learner,
        replay,
        episodes,
        steps,
        train_ratio,
        collector,
        relaunches,
        registry,
    )
