"""Replay-format batches from a real env, for learner tests."""

import torch
from omegaconf import OmegaConf

from dreamer.agent.build import latent_sizes
from dreamer.agent.layout import Head
from dreamer.agent.spaces import EnvSpaces, ObsKey, spaces_from_env
from dreamer.data.replay import SequenceReplay, replay_keys
from dreamer.envs.make import make_env


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


# spaces no registered env has: several observation keys, masked action heads
MULTI_KEY = EnvSpaces(
    (ObsKey("pov", (16, 16, 3), "image"), ObsKey("inventory", (7,), "vector")),
    action_dim=6,
    discrete=True,
)
MASKED = EnvSpaces(
    (
        ObsKey("pov", (16, 16, 3), "image"),
        ObsKey("mask_craft", (4,), "vector"),
        ObsKey("mask_equip", (6,), "vector"),
        ObsKey("mask_place", (6,), "vector"),
        ObsKey("mask_root", (5,), "vector"),
    ),
    action_dim=15,
    discrete=True,
    action_heads=(
        Head(5, mask="mask_root"),
        Head(4, gated_by=((2, "mask_craft"),)),
        Head(6, gated_by=((3, "mask_equip"), (4, "mask_place"))),
    ),
)
