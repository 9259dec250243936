"""gymnasium adapter for the DeepMind Control Suite (``pip install -e '.[dmc]'``):
``env.obs=proprio`` gives each suite observation flattened under its own name,
``vision`` an ``image`` from the official configs' camera, ``both`` both. Episodes end
at the suite's time limit as truncated, at a zero discount as terminated."""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import re
import threading
from pathlib import Path

import gymnasium
import numpy as np

from dreamer.errors import ConfigError

CAMERAS = {"quadruped": 2}  # the official DMC env's DEFAULT_CAMERAS; every other domain: 0
ALIASES = {"cup": "ball_in_cup"}  # official task names use the short domain
# need a GL context even for proprio: quadruped_escape uploads its height field at reset
GL_TASKS = {"quadruped_escape"}
SKYBOX = "./common/skybox.xml"  # the suite's shared asset, in every domain's model but fish's
_SKYBOX_SWAP = threading.Lock()


@contextlib.contextmanager
def suite_skybox(rendered: bool):
    """While a task loads without a renderer, the suite's skybox (11.5 MB per env worker)
    at one texel per face: textures do not enter the dynamics (tests/test_dmc_env.py).
    One load at a time: grouped workers build envs on threads."""
    from dm_control.suite import common

    with _SKYBOX_SWAP:
        full = common.ASSETS[SKYBOX]
        if not rendered:
            common.ASSETS[SKYBOX] = re.sub(
                rb'width="\d+" height="\d+"', b'width="1" height="1"', full
            )
        try:
            yield
        finally:
            common.ASSETS[SKYBOX] = full


def choose_gl_backend(render: bool = True) -> str:
    """MuJoCo's headless renderer, exported before dm_control's import fixes it: ``MUJOCO_GL``
    if set, else ``egl`` with an NVIDIA GPU, ``osmesa`` without, ``disable`` when nothing
    renders (proprio needs no libosmesa6). A missing renderer is a ``ConfigError``."""
    if "MUJOCO_GL" not in os.environ:
        gpu = Path("/dev/nvidiactl").exists()
        os.environ["MUJOCO_GL"] = ("egl" if gpu else "osmesa") if render else "disable"
    backend = os.environ["MUJOCO_GL"]
    if render and backend in ("off", "disable", "disabled", "false", "0"):
        raise ConfigError(f"env.obs: rendering frames needs a renderer, not MUJOCO_GL={backend}")
    if render and backend == "osmesa" and ctypes.util.find_library("OSMesa") is None:
        raise ConfigError(
            "env.obs: MuJoCo's CPU renderer needs Debian's libosmesa6; install it with "
            "apt-get install libosmesa6 (or make osmesa)"
        )
    return backend


def task_names(render: bool = False) -> dict[str, tuple[str, str]]:
    """Every suite task as ``<domain>_<task>`` -> (domain, task); ``render``: the run
    renders (the first dm_control import fixes the renderer)."""
    choose_gl_backend(render)
    from dm_control import suite

    return {f"{domain}_{task}": (domain, task) for domain, task in suite.ALL_TASKS}


def renders(obs: str, task: str) -> bool:
    """Whether an env of ``obs`` on ``task`` needs a renderer (frames, or a GL task)."""
    return obs in ("vision", "both") or task in GL_TASKS


def split_task(name: str, render: bool = False) -> tuple[str, str]:
    """``walker_walk`` -> (walker, walk); KeyError for an unknown task."""
    names = task_names(render)
    if name not in names:
        domain, _, task = name.partition("_")
        name = f"{ALIASES.get(domain, domain)}_{task}"
    return names[name]


class DMCEnv(gymnasium.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self, task: str, obs: str = "proprio", size: int = 64, repeat: int = 1, seed: int = 0
    ):
        render = renders(obs, task)
        choose_gl_backend(render)
        from dm_control import suite

        domain, name = split_task(task, render)
        with suite_skybox(rendered=render):
            self._env = suite.load(domain, name, task_kwargs={"random": seed})
        self._proprio = obs in ("proprio", "both")
        self._vision = obs in ("vision", "both")
        self._size, self._repeat = size, repeat
        self._camera = CAMERAS.get(domain, 0)
        self.render_mode = "rgb_array"
        spaces = {}
        if self._proprio:
            for key, spec in self._env.observation_spec().items():
                size_ = int(np.prod(spec.shape)) if spec.shape else 1
                spaces[key] = gymnasium.spaces.Box(-np.inf, np.inf, (size_,), np.float32)
        if self._vision:
            spaces["image"] = gymnasium.spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.observation_space = gymnasium.spaces.Dict(spaces)
        action = self._env.action_spec()
        self.action_space = gymnasium.spaces.Box(
            action.minimum.astype(np.float32), action.maximum.astype(np.float32), dtype=np.float32
        )

    def _obs(self, time_step) -> dict[str, np.ndarray]:
        obs = {}
        if self._proprio:
            for key, value in time_step.observation.items():
                obs[key] = np.asarray(value, np.float32).reshape(-1)
        if self._vision:
            obs["image"] = self.render()
        return obs

    def render(self) -> np.ndarray:
        """The official camera's frame (a proprio env's sky is one texel per face)."""
        return self._env.physics.render(self._size, self._size, camera_id=self._camera)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self._env.task.random.seed(seed)
        return self._obs(self._env.reset()), {}

    def step(self, action):
        reward, time_step = 0.0, None
        for _ in range(self._repeat):
            time_step = self._env.step(action)
            reward += time_step.reward or 0.0
            if time_step.last():
                break
        terminated = time_step.last() and time_step.discount == 0
        truncated = time_step.last() and not terminated
        return self._obs(time_step), reward, terminated, truncated, {}

    def close(self):
        # frees GL now: left to the GC, its __del__ waited forever on dm_control's renderer
        self._env.physics.free()
        self._env.close()


def make(env, seed: int) -> DMCEnv:
    return DMCEnv(env["task"], env["obs"], env["size"], env["repeat"], seed=seed)


def check(env) -> None:
    """A suite task (listing them loads dm_control, with no renderer for proprio)."""
    render = renders(env["obs"], env["task"])
    try:
        split_task(env["task"], render)
    except KeyError:
        names = ", ".join(sorted(task_names(render)))
        raise ConfigError(f"env.task: unknown DMC task {env['task']!r}; allowed: {names}") from None
