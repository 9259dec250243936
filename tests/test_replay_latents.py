"""Replay keeps no acting latent: the world model starts every replayed window from
zeros, so the latents the collector delivers are neither stored nor read."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from dreamer.agent.build import build_agent, latent_sizes
from dreamer.agent.spaces import spaces_from_env
from dreamer.command_line import load
from dreamer.data.replay import ENV_INDEX, SequenceReplay
from dreamer.envs.make import make_env
from dreamer.learning.learner import Learner, cpu_has_bf16
from tests.batches import real_batch
from tests.ddp_updates import same_draws
from tests.torchrl_reference import TorchrlReference

LATENTS = ("state", "belief")


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_replay_of_acting_transitions_holds_no_latent_and_its_sample_trains(storage, tmp_path):
    cfg = load(["experiment=smoke", "env=cartpole", f"replay.storage={storage}"])
    env = make_env(OmegaConf.to_container(cfg.env), seed=0, latent=latent_sizes(cfg.model))
    torch.manual_seed(0)
    spaces = spaces_from_env(env)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    steps = cfg.replay.batch * cfg.replay.length
    with torch.no_grad():
        acted = env.rollout(steps, policy=agent.policy, break_when_any_done=False)
    env.close()
    assert acted.get("belief").abs().sum() > 0, "the collector delivers the acting latents"
    acted.set(ENV_INDEX, torch.zeros(steps, dtype=torch.long))
    replay = SequenceReplay.from_config(cfg, [key.name for key in spaces.obs], tmp_path)
    replay.extend(acted)

    sample = replay.sample()
    stored = {key for key in sample.keys(True, True)}
    assert not stored & {*LATENTS, ("next", "state"), ("next", "belief")}
    assert ("next", "observation") in stored and "action" in stored
    for precision in ("fp32", "bf16") if cpu_has_bf16() else ("fp32",):
        learner_cfg = load(["experiment=smoke", "env=cartpole", f"learner.precision={precision}"])
        learner = Learner(agent, learner_cfg.learner, torch.device("cpu"))
        losses = learner.update(sample.clone())
        terms = [key for key in losses if key.startswith("loss_")]
        assert "loss_model_reco" in terms and "loss_actor" in terms
        assert all(math.isfinite(losses[key]) for key in terms), losses


@pytest.mark.parametrize("ours", [False, True], ids=["torchrl", "ours"])
def test_the_world_model_starts_from_zeros_whatever_latent_a_sample_holds(ours):
    cfg = load(["experiment=smoke", "env=cartpole"])
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    torch.manual_seed(0)
    loss = build_agent(cfg.model, cfg.learner, spaces).loss
    module = loss if ours else TorchrlReference(loss)
    state_size, belief_size = latent_sizes(cfg.model)
    stale = batch.clone()  # what a replay of the old layout held: acting latents
    stale.set("state", torch.randn(*batch.shape, state_size))
    stale.set("belief", torch.randn(*batch.shape, belief_size))
    with torch.no_grad(), same_draws():
        fresh_losses, stale_losses = module(batch.clone()), module(stale)
    terms = [key for key in fresh_losses.keys() if key.startswith("loss_model")]
    assert len(terms) == 5
    for key in terms:
        assert torch.equal(fresh_losses[key], stale_losses[key]), key
