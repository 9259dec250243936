"""What the agent needs to know about an environment, as plain picklable data (the
inference process rebuilds the policy from it: no live torchrl specs or envs)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torchrl.data import Composite, MultiOneHot, OneHot, TensorSpec
from torchrl.envs import ActionScaling

from dreamer.agent.layout import Head, image_shaped
from dreamer.torchrl_compat import gym_env

# Keys that the env transforms add for the agent itself, never encoded.
AGENT_KEYS = ("state", "belief", "previous_action", "is_init", "step_count", "episode_reward")


@dataclass(frozen=True)
class ObsKey:
    """One observation entry: images are HWC uint8, vectors are flat floats."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "image" | "vector"

    @property
    def size(self) -> int:
        return int(torch.Size(self.shape).numel())


@dataclass(frozen=True)
class EnvSpaces:
    obs: tuple[ObsKey, ...]
    action_dim: int
    discrete: bool  # else a box the actor acts in as [-1, 1] per dimension (env rescales)
    action_heads: tuple[Head, ...] = ()  # multi-head discrete actions (MultiOneHot)
    # the env's bounds that [-1, 1] is rescaled to; empty: unscaled (or discrete)
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    @property
    def image_keys(self) -> tuple[ObsKey, ...]:
        return tuple(key for key in self.obs if key.kind == "image")

    @property
    def vector_keys(self) -> tuple[ObsKey, ...]:
        return tuple(key for key in self.obs if key.kind == "vector")


IMAGE_MULTIPLE = 16  # the CNNs halve the image 4 times (CNN_MULTS)


def _obs_kind(name: str, spec: TensorSpec) -> str:
    shape = tuple(spec.shape)
    if image_shaped(shape, spec.dtype == torch.uint8):
        if shape[0] % IMAGE_MULTIPLE or shape[1] % IMAGE_MULTIPLE:
            raise ValueError(
                f"image observation {name!r} is {shape[0]}x{shape[1]}: its sides must be "
                f"multiples of {IMAGE_MULTIPLE}; set env.size (e.g. env.size=64) to resize it"
            )
        return "image"
    if len(shape) <= 1:
        return "vector"
    if len(shape) == 3 and spec.dtype == torch.uint8:
        raise ValueError(
            f"image observation {name!r} has {shape[-1]} channels: expected 1 or 3; set "
            "env.gray=true for one channel (and env.size to resize it)"
        )
    raise ValueError(
        f"unsupported observation {name!r} of shape {shape} ({spec.dtype}): "
        "expected an HWC uint8 image or a flat vector"
    )


def spaces_from_env(env) -> EnvSpaces:
    """Describe a ``make_env`` env; a gymnasium adapter with masked multi-head actions
    says how its heads relate through an ``action_heads`` attribute."""
    adapter = gym_env(env.base_env)
    heads = getattr(getattr(adapter, "unwrapped", adapter), "action_heads", None)
    spaces = spaces_from_specs(env.observation_spec, env.full_action_spec["action"], heads)
    if any(isinstance(transform, ActionScaling) for transform in env.transform):
        space = env.base_env.full_action_spec["action"].space
        low, high = tuple(space.low.tolist()), tuple(space.high.tolist())
        spaces = dataclasses.replace(spaces, action_low=low, action_high=high)
    return spaces


def spaces_from_specs(
    observation_spec: Composite, action_spec: TensorSpec, heads: tuple[Head, ...] | None = None
) -> EnvSpaces:
    """Describe a torchrl env's observation and action specs for the agent."""
    obs = []
    for name in sorted(observation_spec.keys()):
        if name in AGENT_KEYS or name.startswith("info_"):
            continue
        spec = observation_spec[name]
        shape = tuple(spec.shape) if len(spec.shape) else (1,)
        obs.append(ObsKey(name, shape, _obs_kind(name, spec)))
    if not obs:
        raise ValueError("the environment has no observation the agent can encode")
    if isinstance(action_spec, MultiOneHot):  # a OneHot subclass: test it first
        sizes = [int(n) for n in action_spec.nvec]
        heads = tuple(heads) if heads else tuple(Head(size) for size in sizes)
        if [head.size for head in heads] != sizes:
            raise ValueError(f"action heads {[h.size for h in heads]} do not match {sizes}")
        return EnvSpaces(tuple(obs), sum(sizes), discrete=True, action_heads=heads)
    if isinstance(action_spec, OneHot):
        return EnvSpaces(tuple(obs), int(action_spec.shape[-1]), discrete=True)
    if len(action_spec.shape) != 1:
        raise ValueError(f"unsupported action shape {tuple(action_spec.shape)}")
    return EnvSpaces(tuple(obs), int(action_spec.shape[-1]), discrete=False)


def spaces_to_dict(spaces: EnvSpaces) -> dict:
    """Plain data (checkpoints hold it: no pickled classes of ours)."""
    return dataclasses.asdict(spaces)


def spaces_from_dict(data: dict) -> EnvSpaces:
    heads = tuple(
        Head(head["size"], head["mask"], tuple(tuple(gate) for gate in head["gated_by"]))
        for head in data["action_heads"]
    )
    obs = tuple(ObsKey(key["name"], tuple(key["shape"]), key["kind"]) for key in data["obs"])
    return EnvSpaces(
        obs,
        data["action_dim"],
        data["discrete"],
        heads,
        tuple(data.get("action_low", ())),
        tuple(data.get("action_high", ())),
    )


def layout_difference(before: EnvSpaces, after: EnvSpaces) -> str | None:
    """What differs between two observation/action layouts, in words; None if equal."""
    old = {key.name: key for key in before.obs}
    new = {key.name: key for key in after.obs}
    if set(old) != set(new):
        return f"observation keys {sorted(old)} vs {sorted(new)}"
    for name, key in old.items():
        other = new[name]
        if (key.shape, key.kind) != (other.shape, other.kind):
            return f"observation {name!r}: {key.kind} {key.shape} vs {other.kind} {other.shape}"
    for field in ("discrete", "action_dim", "action_heads", "action_low", "action_high"):
        if getattr(before, field) != getattr(after, field):
            return f"action {field}: {getattr(before, field)} vs {getattr(after, field)}"
    return None
