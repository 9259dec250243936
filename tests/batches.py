"""Replay-format batches from a real env, for learner tests."""

import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from torch.nn import functional

from dreamer.agent.build import latent_sizes
from dreamer.agent.masked import Head
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


def synthetic_batch(spaces: EnvSpaces, batch: int, length: int) -> TensorDict:
    """A replay-format batch of random data for agents whose envs cannot run here
    (MineDojo-like several keys and masked multi-head actions, DMC-like proprio)."""
    g = torch.Generator().manual_seed(0)
    shape = (batch, length)
    nxt = {}
    for key in spaces.obs:
        if key.kind == "image":
            nxt[key.name] = torch.randint(0, 256, (*shape, *key.shape), generator=g).byte()
        else:
            nxt[key.name] = torch.randn(*shape, *key.shape, generator=g)
    if spaces.action_heads:
        sizes = [head.size for head in spaces.action_heads]
        parts = [torch.randint(0, n, shape, generator=g) for n in sizes]
        action = torch.cat([functional.one_hot(p, n) for p, n in zip(parts, sizes)], -1)
    elif spaces.discrete:
        action = functional.one_hot(torch.randint(0, spaces.action_dim, shape, generator=g))
    else:
        action = torch.rand(*shape, spaces.action_dim, generator=g) * 2 - 1
    done = torch.rand(*shape, 1, generator=g) < 0.05
    nxt.update(
        reward=torch.randn(*shape, 1, generator=g),
        done=done,
        terminated=done & (torch.rand(*shape, 1, generator=g) < 0.5),
    )
    is_init = torch.zeros(*shape, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[:, 1:] = done[:, :-1]
    return TensorDict(
        {
            "action": action,
            "is_init": is_init,
            "next": TensorDict(nxt, shape),
        },
        shape,
    )


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
