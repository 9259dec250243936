"""Recreating an environment that raises or returns what its spaces do not allow: one
broken env does not end a run; one broken for good ends it with one line."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import gymnasium
import numpy as np

log = logging.getLogger(__name__)


class EnvFatalError(RuntimeError):
    """A failure that recreating the env cannot fix (e.g. a launch-lock timeout)."""


class EnvDataError(RuntimeError):
    """The env returned an observation or reward its own spaces do not allow."""


class Checked(gymnasium.Wrapper):
    """Raises ``EnvDataError`` on an observation off its space's shape or dtype kind, or a
    NaN or infinite observation or reward: such a transition never reaches the agent."""

    def __init__(self, env: gymnasium.Env, name: str):
        super().__init__(env)
        self.name = name
        self.t = 0  # steps into the episode
        self.steps = 0  # steps of this env object
        space = env.observation_space
        spaces = space.spaces if isinstance(space, gymnasium.spaces.Dict) else {None: space}
        self.checked = {
            key: sub
            for key, sub in spaces.items()
            if getattr(sub, "shape", None) is not None and getattr(sub, "dtype", None) is not None
        }

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.t = 0
        self._check(obs, 0.0)
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        self.steps += 1
        self._check(obs, reward)
        return obs, reward, terminated, truncated, info

    def _check(self, obs, reward) -> None:
        for key, space in self.checked.items():
            name = "the observation" if key is None else f"observation {key!r}"
            if key is not None and key not in obs:
                self._fail(f"{name} is missing")
            value = np.asarray(obs if key is None else obs[key])
            if value.shape != space.shape:
                self._fail(f"{name} has shape {value.shape}; its space says {space.shape}")
            if value.dtype != space.dtype and not np.can_cast(
                value.dtype, space.dtype, casting="same_kind"
            ):
                self._fail(f"{name} has dtype {value.dtype}; its space says {space.dtype}")
            if value.dtype.kind in "fc" and not np.isfinite(value).all():
                self._fail(f"{name} holds NaN or Inf")
        if not np.isfinite(reward):
            self._fail(f"the reward is {reward}")

    def _fail(self, problem: str):
        where = f"step {self.t} of an episode (its step {self.steps})" if self.t else "the reset"
        raise EnvDataError(f"env {self.name}: {problem} at {where}")


class Restarting(gymnasium.Wrapper):
    """Builds a fresh env from ``factory`` when ``step`` or ``reset`` raises; a failed
    ``step`` ends the episode as truncated with ``info["restart"]`` 1 (``env/restarts``).
    ``attempts`` failures without a good step between re-raise, an ``EnvFatalError`` at once."""

    def __init__(self, factory: Callable[[], gymnasium.Env], attempts: int = 3):
        super().__init__(factory())
        self._factory = factory
        self._attempts = attempts
        self._failures = 0  # since the last good step
        self.restarts = 0

    def _failed(self, error: Exception) -> None:
        self._failures += 1
        if self._failures >= self._attempts:
            raise RuntimeError(f"env failed {self._failures} times in a row: {error}") from error

    def _recreate_and_reset(self, error: Exception, **reset_kwargs):
        while True:
            self._failed(error)
            self.restarts += 1
            log.warning("env failed (%s); recreating it (%d)", error, self._failures)
            with contextlib.suppress(Exception):
                self.env.close()
            try:
                self.env = self._factory()
                return self.env.reset(**reset_kwargs)
            except EnvFatalError:
                raise
            except Exception as next_error:  # noqa: BLE001 - any env failure
                error = next_error

    def reset(self, **kwargs):
        try:
            obs, info = self.env.reset(**kwargs)
        except EnvFatalError:
            raise
        except Exception as error:  # noqa: BLE001 - any env failure
            obs, info = self._recreate_and_reset(error, **kwargs)
        return obs, {**info, "restart": 0}

    def step(self, action):
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
        except EnvFatalError:
            raise
        except Exception as error:  # noqa: BLE001 - any env failure
            obs, info = self._recreate_and_reset(error)
            return obs, 0.0, False, True, {**info, "restart": 1}
        self._failures = 0
        return obs, reward, terminated, truncated, {**info, "restart": 0}
