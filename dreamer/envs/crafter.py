"""Gymnasium adapter for the Crafter benchmark (https://github.com/danijar/crafter), whose
API is gym's old 4-tuple: player death (``discount == 0``) is ``terminated``, the length
limit ``truncated``; the info dict is copied without the large ``semantic`` map.
``crafter.Env(seed=s)`` makes its k-th world from ``hash((s, k))``, so ``reset(seed=s)``
builds a fresh inner env: the worlds, and what happens in them, are deterministic given
the last seed (``OrderedWorld``)."""

from __future__ import annotations

import collections
from typing import Any

import crafter
import gymnasium
import numpy as np
from gymnasium import spaces

from dreamer.envs import crafter_view, crafter_worldgen

ACHIEVEMENTS: tuple[str, ...] = tuple(sorted(crafter.constants.achievements))
ACTIONS: tuple[str, ...] = tuple(crafter.constants.actions)


class InOrder(dict):
    """A chunk's objects as crafter's set uses them (add, remove, iterate), in the order
    they came: a set iterates in memory-address order, and crafter picks the creature
    to despawn by index into it, so one seed's episodes went differently from one process
    (or one env object) to the next."""

    def add(self, obj) -> None:
        self[obj] = None

    def remove(self, obj) -> None:
        del self[obj]


class OrderedWorld(crafter.engine.World):
    def reset(self, seed=None):
        super().reset(seed)
        self._chunks = collections.defaultdict(InOrder)


class FastWorldgenEnv(crafter.Env):
    """crafter 1.8's ``Env.reset``, line for line, with the vectorized world generation
    (``crafter_worldgen.generate_world``): the same world and RNG state, ~3x sooner."""

    def reset(self):
        center = (self._world.area[0] // 2, self._world.area[1] // 2)
        self._episode += 1
        self._step = 0
        self._world.reset(seed=hash((self._seed, self._episode)) % (2**31 - 1))
        self._update_time()
        self._player = crafter.objects.Player(self._world, center)
        self._last_health = self._player.health
        self._world.add(self._player)
        self._unlocked = set()
        crafter_worldgen.generate_world(self._world, self._player)
        return self._obs()


class CrafterEnv(gymnasium.Env):
    """Crafter with the gymnasium 5-tuple API and a ``(size, size, 3)`` uint8 observation."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, size: int = 64, length: int = 10000, seed: int | None = None) -> None:
        self._size = size
        self._length = length
        self.render_mode = "rgb_array"
        self.observation_space = spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = spaces.Discrete(len(ACTIONS))
        if seed is None:
            # Crafter would draw from numpy's global RNG: fresh OS entropy instead
            seed = int(np.random.SeedSequence().generate_state(1)[0] % (2**31 - 1))
        self._env = self._make_inner(seed)
        self._last_obs: np.ndarray | None = None
        self._counts: dict[str, int] = {}

    def _make_inner(self, seed: int) -> crafter.Env:
        # Crafter checks ``self._length and step >= length``, so length=0 disables the limit.
        env = FastWorldgenEnv(size=(self._size, self._size), length=self._length, seed=seed)
        # crafter's LocalView takes half of a step; ours draws the same canvas from the
        # world's maps (the same world object, whose class is swapped below); its ItemView
        # drew the same inventory again at every step
        stock = env._local_view
        env._local_view = crafter_view.LocalView(stock._world, stock._textures, stock._grid)
        env._item_view = crafter_view.ItemView(env._item_view._textures, env._item_view._grid)
        env._world.__class__ = OrderedWorld  # its resets from here on: no world made yet
        return env

    def _image(self, obs: np.ndarray) -> np.ndarray:
        # Crafter returns a transposed (non-contiguous) view; make a fresh contiguous copy.
        image = np.array(obs, dtype=np.uint8, order="C", copy=True)
        assert image.shape == self.observation_space.shape, image.shape
        self._last_obs = image
        return image

    def _player_info(self) -> dict[str, Any]:
        player = self._env._player
        return {
            "inventory": dict(player.inventory),
            "achievements": dict(player.achievements),
            "discount": 1.0,
            "player_pos": np.array(player.pos),
            "achievements_unlocked": (),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self._env = self._make_inner(int(seed))
        obs = self._image(self._env.reset())
        info = self._player_info()
        self._counts = dict(info["achievements"])
        return obs, info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._last_obs is None:
            raise RuntimeError("call reset() before step()")
        obs, reward, done, raw = self._env.step(int(action))
        info: dict[str, Any] = {
            "inventory": dict(raw["inventory"]),
            "achievements": dict(raw["achievements"]),
            "discount": float(raw["discount"]),
            "player_pos": np.array(raw["player_pos"]),
        }
        info["achievements_unlocked"] = tuple(
            name
            for name in ACHIEVEMENTS
            if info["achievements"][name] > 0 and self._counts.get(name, 0) == 0
        )
        self._counts = dict(info["achievements"])
        terminated = info["discount"] == 0.0
        truncated = bool(done) and not terminated
        return self._image(obs), float(reward), terminated, truncated, info

    def render(self) -> np.ndarray | None:
        return None if self._last_obs is None else self._last_obs.copy()


def make(env, seed: int) -> CrafterEnv:
    return CrafterEnv(size=env["size"], length=env["length"], seed=seed)
