"""Recreating an environment that raises, so one broken env does not end a run."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import gymnasium

log = logging.getLogger(__name__)


class EnvFatalError(RuntimeError):
    """A failure that recreating the env cannot fix (e.g. a launch-lock timeout)."""


class Restarting(gymnasium.Wrapper):
    """Builds a fresh env from ``factory`` when ``step`` or ``reset`` raises.

    A failed ``step`` ends the episode as truncated, with the new env's first
    observation; ``info["restart"]`` is 1 on that step (0 otherwise), which the
    trainer counts as ``env/restarts``. ``attempts`` failures in a row re-raise, and so
    does an ``EnvFatalError`` at once.
    """

    def __init__(self, factory: Callable[[], gymnasium.Env], attempts: int = 3):
        super().__init__(factory())
        self._factory = factory
        self._attempts = attempts
        self.restarts = 0

    def _recreate_and_reset(self, error: Exception, **reset_kwargs):
        for attempt in range(1, self._attempts + 1):
            self.restarts += 1
            log.warning("env failed (%r); recreating it (%d)", error, attempt)
            with contextlib.suppress(Exception):
                self.env.close()
            try:
                self.env = self._factory()
                return self.env.reset(**reset_kwargs)
            except EnvFatalError:
                raise
            except Exception as next_error:  # noqa: BLE001 - any env failure
                error = next_error
        raise RuntimeError(f"env failed {self._attempts} times in a row: {error!r}") from error

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
        return obs, reward, terminated, truncated, {**info, "restart": 0}
