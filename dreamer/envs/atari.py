"""Atari through ale-py (``pip install -e '.[atari]'``; its wheel ships the ROMs), as the
official DreamerV3 Atari env: ``env.game`` is a ROM name as ale-py lists it (``pong``,
``ms_pacman``, ...); the other keys are ``AtariSettings``'s (``settings.py``)."""

from __future__ import annotations

import gymnasium

from dreamer.envs.wrappers import ActionRepeat, ImageObservation, NoopStart
from dreamer.errors import ConfigError

MAX_FRAMES = 108_000  # 30 minutes of play, the official length


def game_names() -> list[str]:
    from ale_py import roms

    return sorted(roms.get_all_rom_ids())


def ale_id(game: str) -> str:
    """``ms_pacman`` -> ``ALE/MsPacman-v5``."""
    return "ALE/" + "".join(part.capitalize() for part in game.split("_")) + "-v5"


class LifeLossEnds(gymnasium.Wrapper):
    """``env.lives=reset``: losing a life ends the episode as terminated."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        terminated = terminated or 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated, truncated, info


def register_ale() -> None:
    """ale-py's ids registered with gymnasium; its emulators' banners silenced."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    gymnasium.register_envs(ale_py)


def make(env, seed: int) -> gymnasium.Env:
    register_ale()
    base = gymnasium.make(
        ale_id(env["game"]),
        frameskip=1,  # repeat and pooling are ours, as in the official env
        repeat_action_probability=0.25 if env["sticky"] else 0.0,
        full_action_space=env["actions"] == "all",
        max_num_frames_per_episode=MAX_FRAMES,
    )
    base.reset(seed=seed)  # seeds ALE's own generator (sticky actions)
    if env["lives"] == "reset":
        base = LifeLossEnds(base)
    wrapped = NoopStart(base, env["noops"])  # action 0 is NOOP in both action sets
    wrapped = ActionRepeat(wrapped, env["repeat"], env["pooling"])
    wrapped = ImageObservation(wrapped, env["size"], env["gray"])
    # one key name whatever the channels (torchrl would say "pixels" or "observation")
    named = gymnasium.spaces.Dict({"image": wrapped.observation_space})
    return gymnasium.wrappers.TransformObservation(wrapped, lambda obs: {"image": obs}, named)


def check(env) -> None:
    if env["game"] not in game_names():
        names = ", ".join(game_names())
        raise ConfigError(f"env.game: unknown Atari game {env['game']!r}; allowed: {names}")
