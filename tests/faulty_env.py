"""A gymnasium env that raises every ``fail_every`` steps, for the env-restart tests.

Importing this module registers ``Faulty-v0``; the trainer takes it as
``env=gym env.id=tests.faulty_env:Faulty-v0`` (gymnasium imports the module first).
"""

import os
import time
from pathlib import Path

import gymnasium
import numpy as np

from dreamer.envs.restarts import EnvFatalError


class FaultyEnv(gymnasium.Env):
    """Reward 1 per step, 50-step episodes; step number ``fail_every`` of an instance raises."""

    def __init__(self, fail_every: int = 150):
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.fail_every = fail_every
        self.steps = 0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps % self.fail_every == 0:
            raise RuntimeError(f"faulty env: injected failure at step {self.steps}")
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return obs, 1.0, False, self.t >= 50, {}


gymnasium.register("Faulty-v0", entry_point=FaultyEnv)


class BrokenEnv(gymnasium.Env):
    """An env that cannot be created (a missing asset, a bad install)."""

    def __init__(self):
        raise OSError("broken env: the world files are missing")


gymnasium.register("Broken-v0", entry_point=BrokenEnv)


class RankFaultEnv(FaultyEnv):
    """Healthy on every rank but rank 1 of a torchrun job, where the first step fails
    in a way recreating the env cannot fix: that rank's collection fails for good."""

    def step(self, action):
        if os.environ.get("RANK") == "1":
            raise EnvFatalError("rank fault env: the simulator on rank 1 is gone")
        return super().step(action)


gymnasium.register("RankFault-v0", entry_point=RankFaultEnv)


class BadDataEnv(FaultyEnv):
    """Returns what its spaces do not allow (``bad``: shape, dtype, nan_obs, inf_reward,
    missing) on step ``at`` of each instance and, with ``forever``, on every step after."""

    def __init__(self, bad: str = "nan_obs", at: int = 20, forever: bool = False):
        super().__init__(fail_every=10**9)
        self.observation_space = gymnasium.spaces.Dict(
            {"position": gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)}
        )
        self.bad, self.at, self.forever = bad, at, forever

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return {"position": obs}, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        obs = {"position": obs}
        if self.steps == self.at or (self.forever and self.steps > self.at):
            if self.bad == "shape":
                obs["position"] = np.zeros(4, np.float32)
            elif self.bad == "dtype":
                obs["position"] = np.zeros(3, np.complex64)
            elif self.bad == "nan_obs":
                obs["position"][1] = np.nan
            elif self.bad == "inf_reward":
                reward = float("inf")
            elif self.bad == "missing":
                obs = {}
        return obs, reward, terminated, truncated, info


gymnasium.register("BadData-v0", entry_point=BadDataEnv)


class SlowStartEnv(FaultyEnv):
    """``SlowStart-v0``: takes ``delay`` seconds to make, in whichever process makes it
    (an evaluation process still starting when a run stops), and ``step_delay`` seconds
    per step (an evaluation still running when a run stops); ``stepped``: a file it
    adds a byte to at each step (its first: the moment a test waits for); ``making``: a
    file it creates as its making begins (the moment a process is inside its start)."""

    def __init__(
        self, delay: float = 0.0, step_delay: float = 0.0, stepped: str = "", making: str = ""
    ):
        if making:
            Path(making).touch()
        time.sleep(delay)
        super().__init__(fail_every=10**9)
        self.step_delay, self.stepped = step_delay, stepped

    def step(self, action):
        if self.stepped:
            with Path(self.stepped).open("ab") as stepped:
                stepped.write(b".")
        time.sleep(self.step_delay)
        return super().step(action)


gymnasium.register("SlowStart-v0", entry_point=SlowStartEnv)
