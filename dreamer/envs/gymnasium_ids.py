"""``env=gym`` (any registered gymnasium id: ``env.id=<Id>``, ``env.kwargs={...}`` for
``gymnasium.make``) and ``env=cartpole`` (``CartPole-v1``): image observations resized
or grayed (``env.size`` / ``env.gray``), a vector env rendered to frames
(``env.pixels``), actions repeated (``env.repeat``)."""

from __future__ import annotations

import importlib
import sys

import gymnasium
from omegaconf import OmegaConf

from dreamer.errors import ConfigError, did_you_mean
from dreamer.schema import installed, pip_install


def make(env, seed: int) -> gymnasium.Env:
    """``gymnasium.make(env.id, **env.kwargs)`` with the image keys (``seed``: the
    first reset's, given by torchrl)."""
    from dreamer.envs.wrappers import ActionRepeat, ImageObservation, RenderedFrames

    kwargs = env.get("kwargs") or {}
    kwargs = OmegaConf.to_container(kwargs) if OmegaConf.is_config(kwargs) else dict(kwargs)
    if env.get("pixels"):
        kwargs["render_mode"] = "rgb_array"
    if env["id"].startswith("ALE/"):  # ale-py registers its ids only when imported
        from dreamer.envs.atari import register_ale

        register_ale()
    made = gymnasium.make(env["id"], **kwargs)
    if env.get("pixels"):
        made = RenderedFrames(made)
    if env.get("repeat", 1) > 1:
        made = ActionRepeat(made, env["repeat"])
    if env.get("size") or env.get("gray"):
        made = ImageObservation(made, env.get("size", 0), env.get("gray", False))
    return made


def check(env) -> None:
    """A registered gymnasium id, or ``package.module:Id-v0`` whose module registers it."""
    env_id = env["id"]
    module, _, name = env_id.rpartition(":")
    if env_id.startswith("ALE/"):  # ale-py registers its ids only when imported
        if not installed("ale_py"):
            raise ConfigError(
                f"env.id: {env_id} needs ale-py; install it with {pip_install('atari')}"
            )
        module = "ale_py"
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(f"env.id: cannot import {module!r} for {env_id!r}: {error}") from None
    if module == "ale_py":
        gymnasium.register_envs(sys.modules["ale_py"])
    if (name if ":" in env_id else env_id) not in gymnasium.envs.registry:
        hint = did_you_mean(env_id, gymnasium.envs.registry, "env.id={}")
        raise ConfigError(f"env.id: unknown gymnasium id {env_id!r}{hint}")
