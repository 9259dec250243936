"""env=gym: env.kwargs, env.size, env.gray, env.repeat and env.pixels on gymnasium envs,
and the one-line errors for image frames the agent cannot use."""

import subprocess
import sys

import gymnasium
import numpy as np
import pytest
import torch
from PIL import Image

from dreamer.envs.make import describe_env, make_env
from dreamer.errors import ConfigError


class Painter(gymnasium.Env):
    """A vector env whose rgb_array render (90 x 120) and reward depend on its step."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None, frame=(90, 120, 3)):
        self.render_mode = render_mode
        self.frame = frame
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(2, self.t / 100, np.float32), float(self.t), False, False, {}

    def render(self):
        rows, cols, channels = self.frame
        grid = np.add.outer(np.arange(rows), 3 * np.arange(cols))[..., None]
        return ((grid + 7 * self.t + 50 * np.arange(channels)) % 256).astype(np.uint8)


class Framed(Painter):
    """An image-observation env: its observation is its render."""

    def __init__(self, frame=(90, 120, 3)):
        super().__init__("rgb_array", frame)
        self.observation_space = gymnasium.spaces.Box(0, 255, frame, np.uint8)

    def reset(self, **kwargs):
        super().reset(**kwargs)
        return self.render(), {}

    def step(self, action):
        _, *rest = super().step(action)
        return self.render(), *rest


gymnasium.register("DreamerTest/Painter-v0", entry_point=Painter)
gymnasium.register("DreamerTest/Framed-v0", entry_point=Framed)


def gym(env_id, **keys):
    return {"name": "gym", "id": env_id, "length": 0, "size": 0, "gray": False, **keys}


def image_key(rollout):
    (key,) = [k for k in rollout.keys() if rollout[k].dtype == torch.uint8]
    return key


def frame_at(t, size=None, gray=False):
    image = Painter(frame=(90, 120, 3))
    image.t = t
    frame = image.render()
    if size:
        frame = np.asarray(Image.fromarray(frame).resize((size, size), Image.BILINEAR))
    if gray:
        frame = (frame * [0.299, 0.587, 0.114]).sum(-1).astype(np.uint8)[..., None]
    return frame


def test_pixels_render_a_vector_env_resized_to_size():
    env = make_env(gym("DreamerTest/Painter-v0", pixels=True, size=64), seed=0)
    rollout = env.rollout(3)
    key = image_key(rollout)
    assert tuple(env.observation_spec[key].shape) == (64, 64, 3)
    for t in range(3):
        np.testing.assert_array_equal(rollout["next", key][t].numpy(), frame_at(t + 1, 64))
    env.close()


def test_gray_and_resize_an_image_env():
    env = make_env(gym("DreamerTest/Framed-v0", size=32, gray=True), seed=0)
    rollout = env.rollout(2)
    key = image_key(rollout)
    assert tuple(rollout[key].shape[1:]) == (32, 32, 1)
    np.testing.assert_array_equal(rollout["next", key][1].numpy(), frame_at(2, 32, gray=True))
    env.close()


def test_repeat_and_kwargs():
    env = make_env(gym("DreamerTest/Painter-v0", repeat=3, kwargs={"frame": (16, 16, 3)}), seed=0)
    rollout = env.rollout(4)
    # each agent step is 3 env steps, rewards t summed: (1+2+3), (4+5+6), ...
    assert rollout["next", "reward"].flatten().tolist() == [6.0, 15.0, 24.0, 33.0]
    env.close()
    capped = make_env(gym("DreamerTest/Painter-v0", kwargs={"max_episode_steps": 5}), seed=0)
    rollout = capped.rollout(20)
    assert rollout.shape[0] == 5 and rollout["next", "truncated"][-1].item()
    capped.close()


@pytest.mark.parametrize(("frame", "fix"), [((210, 160, 3), "env.size"), ((64, 64, 4), "env.gray")])
def test_unusable_frames_name_the_keys_that_fix_them(frame, fix):
    config = gym("DreamerTest/Framed-v0", kwargs={"frame": frame})
    with pytest.raises(ConfigError, match=fix):
        describe_env(config, seed=0)


def test_env_size_makes_a_210x160_frame_usable():
    config = gym("DreamerTest/Framed-v0", kwargs={"frame": (210, 160, 3)}, size=64)
    spaces, _ = describe_env(config, seed=0)
    assert [key.shape for key in spaces.image_keys] == [(64, 64, 3)]


def test_an_unusable_image_env_exits_2_with_one_line(tmp_path):
    pytest.importorskip("ale_py")
    result = subprocess.run(
        [sys.executable, "-m", "dreamer.train", "env=gym", "env.id=ALE/Pong-v5"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()  # nor the emulator's banner
    assert line.startswith("error: env:") and "env.size" in line, result.stderr
    assert result.stdout == ""
    assert not any(path.is_dir() for path in (tmp_path / "runs").glob("*/*"))


# an env worker's life in one process: the env built and stepped, its frames encoded by
# torchrl's specs (where torch warned of a read-only NumPy array)
STEPPED = """
import sys
from dreamer.envs.make import make_env
for config in ({"name": "gym", "id": "ALE/Pong-v5", "size": 64}, {"name": "atari"}):
    from dreamer.command_line import load
    from omegaconf import OmegaConf
    env = OmegaConf.to_container(load([f"env={config['name']}", *(
        f"env.{k}={v}" for k, v in config.items() if k != "name")]).env)
    make_env(env, 0).rollout(3)
"""


def test_atari_envs_say_nothing_of_their_own():
    """The emulator's banner ("A.L.E: Arcade Learning Environment ...", "[Powered by
    Stella]"), once per process and run into the run's lines, and torch's warning of a
    read-only frame: neither, through gymnasium's ids nor env=atari."""
    pytest.importorskip("ale_py")
    done = subprocess.run(
        [sys.executable, "-c", STEPPED], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout, done.stderr) == ("", "")
