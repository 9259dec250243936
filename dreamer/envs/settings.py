"""Every env kind's ``env.*`` keys, one dataclass per kind over ``EnvSettings`` (the keys
every env has): what the command line, ``--help`` and a saved config read, without the
env's own packages (gymnasium, the simulators), which only its module
(``dreamer/envs/<module>.py``, ``registry.KINDS``) imports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dreamer.schema import f, mapping


@dataclass
class EnvSettings:
    """The keys every env has."""

    name: str = f()
    """the env kind (set by env=)"""
    length: int = f(check=">= 0")
    """episode step cap (a truncation); 0 = the env's own limit"""
    reward_scale: float = f(1.0, "> 0")
    """factor on every reward the env gives (torchrl's RewardScaling)"""


@dataclass
class AtariSettings(EnvSettings):
    """``env=atari``'s keys; the defaults are the official ``configs.yaml``'s ``env.atari``
    (the 200M-frame protocol: 96 x 96 gray frames, sticky actions, 30 no-ops, max over 2
    frames). ``experiment=atari100k`` sets ``env.atari100k``'s instead."""

    game: str = f("pong")
    """an ale-py ROM name: pong, ms_pacman, ... (official: atari_pong)"""
    size: int = f(96, ">= 16")
    """image side (official env.atari.size: [96, 96])"""
    gray: bool = f(True)
    """one channel (official env.atari.gray: True)"""
    repeat: int = f(4, ">= 1")
    """frames per action (official env.atari.repeat: 4)"""
    sticky: bool = f(True)
    """repeat the previous action with probability 0.25 (official env.atari.sticky)"""
    noops: int = f(30, ">= 0")
    """up to this many random no-op frames after a reset (official env.atari.noops)"""
    lives: str = f("unused", choices=("unused", "reset"))
    """reset: a lost life ends the episode (official env.atari.lives: unused)"""
    pooling: int = f(2, ">= 1")
    """max over the last this many frames of a repeat (official env.atari.pooling)"""
    actions: str = f("all", choices=("all", "minimal"))
    """all 18 actions or the game's minimal set (official env.atari.actions: all)"""


@dataclass
class CrafterSettings(EnvSettings):
    size: int = f(64, ">= 16")
    """image side"""


@dataclass
class CueSettings(EnvSettings):
    cues: int = f(4, ">= 2")
    """cues the task draws from (and actions): reward 1 when the action names the cue
    shown"""
    pixels: bool = f(False)
    """the cue as an image instead of a one-hot vector"""
    size: int = f(64, ">= 16")
    """image side (with pixels)"""


@dataclass
class DmcSettings(EnvSettings):
    task: str = f("walker_walk")
    """<domain>_<task>, e.g. cartpole_balance"""
    obs: str = f("proprio", choices=("proprio", "vision", "both"))
    """what the agent sees: the proprioceptive vector, rendered frames, or both"""
    size: int = f(64, ">= 16")
    """image side (vision)"""
    repeat: int = f(1, ">= 1")
    """action repeat (simulator steps per agent step)"""


@dataclass
class GymSettings(EnvSettings):
    id: str = f()
    """a registered gymnasium id, or package.module:Id-v0 (imported first)"""
    kwargs: dict[str, Any] = mapping()
    """keyword arguments of gymnasium.make"""
    size: int = f(0, ">= 0")
    """resize image observations to size x size; 0 = keep"""
    gray: bool = f(False)
    """gray images (one channel)"""
    repeat: int = f(1, ">= 1")
    """action repeat"""
    pixels: bool = f(False)
    """render the env to frames (its observations become images)"""


@dataclass
class MinedojoSettings(EnvSettings):
    task: str = f("harvest_milk")
    """a MineDojo task id"""
    image_size: int = f(64, ">= 16")
    """side of the POV image"""
    world_seed: int = f(0)
    """seed of the Minecraft world"""
    break_speed: float = f(100.0, "> 0")
    """MineDojo's break_speed_multiplier"""
    sticky_attack: int = f(30, ">= 0")
    """steps an attack keeps going"""
    sticky_jump: int = f(10, ">= 0")
    """steps a jump keeps going"""
    pitch_limit: float = f(60.0, "(0, 90]")
    """camera pitch kept within +- this many degrees"""
    max_steps: int = f(3000, ">= 0")
    """episode cap, ends as a truncation; 0 = none"""
    fast_reset: bool = f(True)
    """MineDojo's fast reset (the world is kept, the agent respawned)"""
    milestone_reward: bool = f(False)
    """+1 the first time each item is obtained"""
    launch_timeout: float = f(600.0, "> 0")
    """seconds to wait for the launch lock"""
