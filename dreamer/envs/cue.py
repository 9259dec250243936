"""``env=cue``: a probe task that only an agent with a working world model solves. Each
step shows one of ``cues`` one-hot cues, drawn anew; the reward is 1 when the action
names the cue shown. A random policy earns ``length / cues`` per episode, a learned one
up to ``length``: the world model must learn reward from (observation, action) and the
actor from imagined returns, so broken keys, ``is_init`` or action wiring show at once.
With ``image`` > 0 the cue is an RGB frame, black but for the cue's coloured vertical
band, read through the CNN encoder."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class CueEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, cues: int = 4, length: int = 16, seed: int | None = None, image: int = 0):
        self.cues = cues
        self.length = length
        self.image = image
        if image:
            self.observation_space = gym.spaces.Box(0, 255, (image, image, 3), np.uint8)
        else:
            self.observation_space = gym.spaces.Box(0.0, 1.0, (cues,), np.float32)
        self.action_space = gym.spaces.Discrete(cues)
        self._rng = np.random.default_rng(seed)
        self._cue = 0
        self._steps = 0

    def _observe(self) -> np.ndarray:
        self._cue = int(self._rng.integers(self.cues))
        if not self.image:
            return np.eye(self.cues, dtype=np.float32)[self._cue]
        frame = np.zeros((self.image, self.image, 3), np.uint8)
        band = slice(self._cue * self.image // self.cues, (self._cue + 1) * self.image // self.cues)
        hue = np.array([(self._cue * 97 + 60) % 256, 255, (255 - self._cue * 61) % 256], np.uint8)
        frame[:, band] = hue
        return frame

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._steps = 0
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == self._cue)
        self._steps += 1
        truncated = self._steps >= self.length
        return self._observe(), reward, False, truncated, {}


def make(env, seed: int) -> CueEnv:
    image = env["size"] if env.get("pixels") else 0
    return CueEnv(cues=env["cues"], length=env["length"], seed=seed, image=image)
