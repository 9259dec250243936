"""``make_env``: one environment for the agent, as a torchrl ``EnvBase``.

Adapters: ``crafter`` (embedded default), ``cartpole`` and ``gym`` (any gymnasium id),
``cue`` (a probe task for learning checks), ``dmc`` and ``atari`` (the ``dmc`` and
``atari`` extras), ``minedojo`` (needs the ``minedojo`` extra).
Every env carries the transforms the DreamerV3 acting policy needs: ``is_init``, an
episode step counter and return, and zero-initialised ``state``/``belief``/
``previous_action`` entries that the policy fills and ``step_mdp`` carries.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import gymnasium
import numpy as np
import torch
from omegaconf import OmegaConf, open_dict
from torchrl.data import Unbounded
from torchrl.envs import (
    ActionScaling,
    ClipTransform,
    Compose,
    DoubleToFloat,
    EnvBase,
    GymWrapper,
    InitTracker,
    RewardScaling,
    RewardSum,
    StepCounter,
    TensorDictPrimer,
    TransformedEnv,
)
from torchrl.envs.gym_like import default_info_dict_reader

from dreamer.config import installed
from dreamer.envs.restarts import Checked, Restarting
from dreamer.errors import ConfigError

log = logging.getLogger("dreamer")
ACHIEVEMENTS_KEY = "info_achievements"
RESTART_KEY = "info_restart"  # 1 on a step where a failed env was recreated


class _CrafterAchievements(default_info_dict_reader):
    """Reads Crafter's per-episode achievement counts as one int vector."""

    def __init__(self, names: tuple[str, ...]):
        super().__init__(
            [ACHIEVEMENTS_KEY],
            spec={ACHIEVEMENTS_KEY: Unbounded((len(names),), dtype=torch.int64)},
        )
        self.names = names

    def __call__(self, info_dict, tensordict):
        if "achievements" in info_dict:
            counts = [info_dict["achievements"][name] for name in self.names]
            info_dict = {ACHIEVEMENTS_KEY: np.asarray(counts, dtype=np.int64)}
        else:
            info_dict = {ACHIEVEMENTS_KEY: np.zeros(len(self.names), dtype=np.int64)}
        return super().__call__(info_dict, tensordict)


class _Restarts(default_info_dict_reader):
    """Reads an adapter's ``info["restart"]`` flag."""

    def __init__(self):
        super().__init__([RESTART_KEY], spec={RESTART_KEY: Unbounded((1,), dtype=torch.int64)})

    def __call__(self, info_dict, tensordict):
        flag = np.asarray([info_dict.get("restart", 0)], dtype=np.int64)
        return super().__call__({RESTART_KEY: flag}, tensordict)


def env_label(env: Mapping) -> str:
    """How lines name the configured env: its gymnasium id for ``env=gym``."""
    return env["id"] if env["name"] == "gym" else env["name"]


def _adapter(env: Mapping, seed: int) -> Callable[[], gymnasium.Env]:
    """A factory of the gymnasium env (called again to recreate a failed one)."""
    if env["name"] == "crafter":
        from dreamer.envs.crafter import CrafterEnv

        return functools.partial(CrafterEnv, size=env["size"], length=env["length"], seed=seed)
    if env["name"] == "cue":
        from dreamer.envs.cue import CueEnv

        image = env["size"] if env.get("pixels") else 0
        return functools.partial(
            CueEnv, cues=env["cues"], length=env["length"], seed=seed, image=image
        )
    if env["name"] == "minedojo":
        from dreamer.envs.minedojo import from_config

        return functools.partial(from_config, env, seed)
    if env["name"] == "dmc":
        from dreamer.envs.dmc import DMCEnv

        return functools.partial(
            DMCEnv, env["task"], env["obs"], env["size"], env["repeat"], seed=seed
        )
    if env["name"] == "atari":
        from dreamer.envs.atari import make_atari

        return functools.partial(make_atari, env, seed)
    return functools.partial(_make_gym, env)


def _make_gym(env: Mapping) -> gymnasium.Env:
    """``env=gym``/``cartpole``: ``gymnasium.make(env.id, **env.kwargs)`` with the image keys."""
    from dreamer.envs.wrappers import ActionRepeat, ImageObservation, RenderedFrames

    kwargs = env.get("kwargs") or {}
    kwargs = OmegaConf.to_container(kwargs) if OmegaConf.is_config(kwargs) else dict(kwargs)
    if env.get("pixels"):
        kwargs["render_mode"] = "rgb_array"
    if env["id"].startswith("ALE/"):  # ale-py registers its ids only when imported
        import ale_py

        gymnasium.register_envs(ale_py)
    made = gymnasium.make(env["id"], **kwargs)
    if env.get("pixels"):
        made = RenderedFrames(made)
    if env.get("repeat", 1) > 1:
        made = ActionRepeat(made, env["repeat"])
    if env.get("size") or env.get("gray"):
        made = ImageObservation(made, env.get("size", 0), env.get("gray", False))
    return made


def _base_env(env: Mapping, seed: int) -> tuple[EnvBase, int]:
    """The raw env and the step cap still to enforce (0: the env enforces its own)."""
    factory = _adapter(env, seed)
    base = GymWrapper(Restarting(lambda: Checked(factory(), env_label(env))))
    base.set_info_dict_reader(_Restarts())
    if env["name"] == "crafter":
        from dreamer.envs.crafter import ACHIEVEMENTS

        base.set_info_dict_reader(_CrafterAchievements(ACHIEVEMENTS))
    return base, env["length"] if env["name"] in ("atari", "cartpole", "dmc", "gym") else 0


def finite_action_bounds(action_spec) -> bool:
    """Whether a continuous action spec has a finite low and high in every dimension;
    an action with an infinite bound is passed to the env unscaled."""
    space = getattr(action_spec, "space", None)
    if not hasattr(space, "low"):
        return False
    limit = torch.finfo(space.low.dtype).max  # torchrl's Unbounded stores +-finfo.max
    low, high = space.low, space.high
    return bool((low.isfinite() & high.isfinite() & (low > -limit) & (high < limit)).all())


def action_note(env: EnvBase) -> str | None:
    """A start-up warning for a continuous action the agent cannot rescale."""
    spec = env.base_env.full_action_spec["action"]
    if spec.domain != "continuous" or finite_action_bounds(spec):
        return None
    return (
        f"the env's continuous action has an infinite bound (low {spec.space.low.tolist()}, "
        f"high {spec.space.high.tolist()}): the actor's [-1, 1] actions are passed unscaled"
    )


def env_config(env, logdir: Path):
    """The ``env`` config node for the workers (it pickles), plus the run directory's
    paths."""
    env = OmegaConf.create(OmegaConf.to_container(env) if OmegaConf.is_config(env) else env)
    if env["name"] == "minedojo":
        with open_dict(env):
            env.launch_lock = str(logdir / "minedojo-launch.lock")
    return env


def check_env(env) -> None:
    """What the machine must offer for ``env``: its package (one ``ConfigError`` line
    with the pip command), and a task, game or gymnasium id that package has."""
    name = env["name"]
    package = {"dmc": "dm_control", "atari": "ale_py", "minedojo": "minedojo"}.get(name)
    if name == "minedojo" and not installed(package):
        raise ConfigError(
            "env: minedojo is not installed; install it with pip install -e '.[minedojo]'"
            " (MineDojo also needs gym 0.21, numpy<2, JDK 8 and xvfb: see README)"
        )
    if package and not installed(package):
        raise ConfigError(
            f"env: {name} needs {package}; install it with pip install -e '.[{name}]'"
        )
    if name == "dmc":
        from dreamer.envs.dmc import split_task, task_names

        render = env["obs"] in ("vision", "both")
        try:
            split_task(env["task"], render)
        except KeyError:
            names = ", ".join(sorted(task_names(render)))
            raise ConfigError(
                f"env.task: unknown DMC task {env['task']!r}; allowed: {names}"
            ) from None
    elif name == "atari":
        from dreamer.envs.atari import game_names

        if env["game"] not in game_names():
            names = ", ".join(game_names())
            raise ConfigError(f"env.game: unknown Atari game {env['game']!r}; allowed: {names}")
    elif name in ("cartpole", "gym"):
        _check_gym_id(env["id"])


def _check_gym_id(env_id: str) -> None:
    """A registered gymnasium id, or ``package.module:Id-v0`` whose module registers it."""
    module, _, name = env_id.rpartition(":")
    if env_id.startswith("ALE/"):  # ale-py registers its ids only when imported
        if not installed("ale_py"):
            raise ConfigError(
                f"env.id: {env_id} needs ale-py; install it with pip install -e '.[atari]'"
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
        raise ConfigError(f"env.id: unknown gymnasium id {env_id!r}")


def describe_env(env, seed: int) -> tuple:
    """(spaces, achievement names) of the configured env, probed once in this process;
    a broken env is one ``ConfigError`` line, before any worker starts."""
    from dreamer.agent.spaces import spaces_from_env

    check_env(env)
    try:
        probe = make_env(env, seed)
    except ConfigError:
        raise
    except Exception as error:
        what = env_label(env)
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


def make_env(
    env: Mapping, seed: int, latent: tuple[int, int] | None = None, step_cap: int = 0
) -> EnvBase:
    """Build one env from the ``env`` config node (a plain mapping so it pickles).

    ``latent`` = (state size, belief size) adds the acting-policy entries; ``step_cap``
    ends episodes (as truncated) after that many steps, if sooner than the env's own cap.
    """
    base, own_cap = _base_env(env, seed)
    caps = [cap for cap in (own_cap, step_cap) if cap]
    transforms = [
        InitTracker(),
        StepCounter(max_steps=min(caps) if caps else None),
        RewardSum(),
    ]
    if any(spec.dtype == torch.float64 for spec in base.observation_spec.values(True, True)):
        transforms.append(DoubleToFloat())
    if env.get("reward_scale", 1.0) != 1.0:
        transforms.append(RewardScaling(0.0, env["reward_scale"]))
    action_spec = base.full_action_spec["action"]
    if action_spec.domain == "continuous" and finite_action_bounds(action_spec):
        # The actor acts in [-1, 1] per dimension; each dimension is rescaled to its own
        # [low, high] (as the official NormalizeAction does). Inverse transforms run last
        # to first: clip to [-1, 1], then rescale.
        transforms += [ActionScaling(), ClipTransform(in_keys_inv=["action"], low=-1.0, high=1.0)]
    if latent is not None:
        state, belief = latent
        action_size = action_spec.shape[-1]
        transforms.append(
            TensorDictPrimer(
                state=Unbounded(state),
                belief=Unbounded(belief),
                previous_action=Unbounded(action_size),
                default_value=0.0,
            )
        )
    result = TransformedEnv(base, Compose(*transforms))
    if env["name"] != "minedojo":  # seeded by minedojo.make; a seeding reset would launch Java
        result.set_seed(seed)
    return result
