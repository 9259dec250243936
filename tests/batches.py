"""Replay-format batches from a real env, for learner tests."""

import torch
from omegaconf import OmegaConf

from dreamer.agent.build import latent_sizes
from dreamer.agent.spaces import spaces_from_env
from dreamer.envs import make_env
from dreamer.replay import SequenceReplay, replay_keys


def real_batch(cfg, batch: int, length: int, seed: int = 0):
    """Random-policy transitions from the real env, cut into [batch, length] windows."""
    latent = latent_sizes(cfg.model)
    env = make_env(OmegaConf.to_container(cfg.env), seed=seed, latent=latent)
    spaces = spaces_from_env(env)
    torch.manual_seed(seed)
    rollout = env.rollout(batch * length, break_when_any_done=False)
    env.close()
    rollout.set("env_index", torch.zeros(rollout.shape[0], dtype=torch.long))
    replay = SequenceReplay(
        batch * length, 1, batch, length, replay_keys([k.name for k in spaces.obs]), seed=seed
    )
    replay.extend(rollout)
    return spaces, replay.sample()
