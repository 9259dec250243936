"""The cue probe, as a vector and as pixels (the `pixels` learning check's env)."""

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from dreamer.envs.cue import CueEnv


@pytest.mark.parametrize("image", [0, 32])
def test_cue_env_passes_gymnasiums_checker(image):
    check_env(CueEnv(cues=4, length=16, seed=0, image=image), skip_render_check=True)


def test_reward_is_one_exactly_when_the_action_names_the_shown_cue():
    env = CueEnv(cues=4, length=16, seed=3)
    obs, _ = env.reset(seed=3)
    ends = []
    for step in range(16):
        cue = int(obs.argmax())
        action = cue if step % 2 else (cue + 1) % 4
        obs, reward, terminated, truncated, _ = env.step(action)
        assert reward == float(step % 2) and not terminated
        ends.append(truncated)
    assert ends == [False] * 15 + [True]


def test_pixel_frame_shows_the_cue_as_its_own_band():
    env = CueEnv(cues=4, length=16, seed=1, image=32)
    frames = {}
    obs, _ = env.reset(seed=1)
    for _ in range(40):
        frames.setdefault(env._cue, obs)
        obs, *_ = env.step(0)
    assert sorted(frames) == [0, 1, 2, 3]
    for cue, frame in frames.items():
        assert frame.shape == (32, 32, 3) and frame.dtype == np.uint8
        lit = np.flatnonzero(frame.any(axis=(0, 2)))  # columns that are not black
        assert lit.min() == cue * 8 and lit.max() == cue * 8 + 7
    colours = {tuple(frame[0, cue * 8]) for cue, frame in frames.items()}
    assert len(colours) == 4  # each cue has a colour of its own as well
