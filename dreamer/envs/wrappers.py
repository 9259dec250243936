"""gymnasium wrappers for the ``env.*`` image and timing keys: action repeat with frame
pooling, random no-op starts, resizing and graying images, rendering a vector env to
frames. They run in the env worker, so replay and the agent only see the final frames."""

from __future__ import annotations

import gymnasium
import numpy as np

from dreamer.agent.layout import image_shaped

GRAY_WEIGHTS = np.array([0.299, 0.587, 0.114])  # ITU-R 601 luma, as the official Atari env


def is_image(space: gymnasium.Space) -> bool:
    box = isinstance(space, gymnasium.spaces.Box)
    return box and image_shaped(space.shape, space.dtype == np.uint8)


def resize_image(image: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize to size x size with Pillow (the official envs' ``resize: pillow``)."""
    if image.shape[:2] == (size, size):
        return image
    from PIL import Image

    channels = image.shape[-1]
    picture = Image.fromarray(image[..., 0] if channels == 1 else image)
    out = np.array(picture.resize((size, size), Image.BILINEAR))  # writable: torch warned
    return out[..., None] if channels == 1 else out


def gray_image(image: np.ndarray) -> np.ndarray:
    if image.shape[-1] == 1:
        return image
    return (image * GRAY_WEIGHTS).sum(-1).astype(np.uint8)[..., None]


class ImageObservation(gymnasium.ObservationWrapper):
    """Resizes (``size`` > 0) and grays every HWC uint8 image in the observation."""

    def __init__(self, env: gymnasium.Env, size: int, gray: bool):
        super().__init__(env)
        self.size, self.gray = size, gray
        space = env.observation_space
        if isinstance(space, gymnasium.spaces.Dict):
            self.observation_space = gymnasium.spaces.Dict(
                {key: self._space(sub) for key, sub in space.spaces.items()}
            )
        else:
            self.observation_space = self._space(space)

    def _space(self, space: gymnasium.Space) -> gymnasium.Space:
        if not is_image(space):
            return space
        height, width, channels = space.shape
        if self.size:
            height = width = self.size
        return gymnasium.spaces.Box(0, 255, (height, width, 1 if self.gray else channels), np.uint8)

    def _image(self, image: np.ndarray) -> np.ndarray:
        if self.size:
            image = resize_image(image, self.size)
        return gray_image(image) if self.gray else image

    def observation(self, observation):
        space = self.env.observation_space
        if isinstance(space, gymnasium.spaces.Dict):
            return {
                key: self._image(value) if is_image(space[key]) else value
                for key, value in observation.items()
            }
        return self._image(observation) if is_image(space) else observation


class ActionRepeat(gymnasium.Wrapper):
    """Repeats each action ``repeat`` times, summing rewards; ``pooling`` > 1 returns the
    pixel-wise max over the last ``pooling`` frames of an image observation (flicker)."""

    def __init__(self, env: gymnasium.Env, repeat: int, pooling: int = 1):
        super().__init__(env)
        self.repeat = repeat
        self.pooling = pooling if is_image(env.observation_space) else 1

    def step(self, action):
        total, frames = 0.0, []
        for index in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if index >= self.repeat - self.pooling:
                frames.append(obs)
            if terminated or truncated:
                break
        if len(frames) > 1:
            obs = np.maximum.reduce(frames)
        return obs, total, terminated, truncated, info


class NoopStart(gymnasium.Wrapper):
    """After each reset, takes a random number of no-op actions in [0, ``noops``]."""

    def __init__(self, env: gymnasium.Env, noops: int, noop_action: int = 0):
        super().__init__(env)
        self.noops, self.noop_action = noops, noop_action
        self.rng = np.random.default_rng()

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        obs, info = self.env.reset(seed=seed, options=options)
        for _ in range(int(self.rng.integers(self.noops + 1))):
            obs, _, terminated, truncated, info = self.env.step(self.noop_action)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class RenderedFrames(gymnasium.ObservationWrapper):
    """Replaces a vector env's observation by its ``rgb_array`` render (``env.pixels``)."""

    def __init__(self, env: gymnasium.Env):
        super().__init__(env)
        env.reset()  # most envs render only once reset
        frame = env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3:
            raise ValueError(
                f"env.pixels: {env.spec.id if env.spec else env} does not render rgb_array frames"
            )
        self.observation_space = gymnasium.spaces.Box(0, 255, frame.shape, np.uint8)

    def reset(self, **kwargs):
        _, info = self.env.reset(**kwargs)
        return self.env.render(), info

    def observation(self, observation):
        return self.env.render()
