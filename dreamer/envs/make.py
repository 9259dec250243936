"""``make_env``: one environment of any kind (``registry.py``) as a torchrl ``EnvBase``,
with the transforms the acting policy needs: ``is_init``, step counter, episode return,
and zeroed ``state``/``belief``/``previous_action`` entries that ``step_mdp`` carries."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

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

from dreamer.envs import registry
from dreamer.envs.restarts import Checked, Restarting
from dreamer.errors import ConfigError, first_line

if TYPE_CHECKING:
    from tensordict import TensorDict

    from dreamer.agent.spaces import EnvSpaces

log = logging.getLogger("dreamer")
ACHIEVEMENTS_KEY = "info_achievements"
RESTART_KEY = "info_restart"  # 1 on a step where a failed env was recreated


class _Achievements(default_info_dict_reader):
    """Reads an env's per-episode achievement counts (Crafter's) as one int vector."""

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


def _base_env(env: Mapping, kind: registry.EnvKind, seed: int) -> tuple[EnvBase, int]:
    """The raw env and the step cap still to enforce (0: the env enforces its own)."""
    factory = functools.partial(kind.adapter.make, env, seed)
    base = GymWrapper(Restarting(lambda: Checked(factory(), registry.label(env))))
    base.set_info_dict_reader(_Restarts())
    if kind.achievements:
        base.set_info_dict_reader(_Achievements(kind.achievements))
    return base, env["length"] if kind.caps_episodes else 0


def finite_action_bounds(action_spec) -> bool:
    """Whether a continuous action spec's bounds are finite (else actions go unscaled)."""
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
    """The ``env`` config node for the workers (it pickles), with the run directory's paths."""
    env = OmegaConf.create(OmegaConf.to_container(env) if OmegaConf.is_config(env) else env)
    if registry.kind(env["name"]).launch_lock:
        with open_dict(env):
            env.launch_lock = str(logdir / f"{env['name']}-launch.lock")
    return env


class EnvProbe(NamedTuple):
    """What the driver learns from one env of the run before any worker starts."""

    spaces: EnvSpaces
    achievements: tuple[str, ...]
    sample: TensorDict  # the env's zero steps (fake_tensordict), with the acting entries


def probe_env(env, seed: int, latent: tuple[int, int] | None = None) -> EnvProbe:
    """One env built in this process and closed: its spaces, achievement names and zero
    sample (with the acting entries for ``latent``); a broken env is a ``ConfigError``."""
    from dreamer.agent.spaces import spaces_from_env

    kind = registry.kind(env["name"])
    kind.check(env)
    try:
        probe = make_env(env, seed, latent)
    except ConfigError:
        raise
    except Exception as error:
        what = registry.label(env)
        raise ConfigError(f"env: cannot create {what}: {first_line(error)}") from error
    try:
        try:
            spaces = spaces_from_env(probe)
        except ValueError as error:
            raise ConfigError(f"env: {error}") from None
        if note := action_note(probe):
            log.warning(note)
        sample = probe.fake_tensordict()
    finally:
        probe.close()
    return EnvProbe(spaces, kind.achievements, sample)


def describe_env(env, seed: int) -> tuple:
    """(spaces, achievement names) of the configured env (``probe_env``)."""
    probed = probe_env(env, seed)
    return probed.spaces, probed.achievements


def make_env(
    env: Mapping, seed: int, latent: tuple[int, int] | None = None, step_cap: int = 0
) -> EnvBase:
    """One env from the ``env`` config node. ``latent`` = (state size, belief size) adds
    the acting-policy entries; ``step_cap`` truncates episodes after that many steps, if
    sooner than the env's own cap."""
    kind = registry.kind(env["name"])
    base, own_cap = _base_env(env, kind, seed)
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
        # inverse transforms run last to first: clip to [-1, 1], then rescale per dimension
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
    if not kind.seeded_by_make:
        result.set_seed(seed)
    return result
