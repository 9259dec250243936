"""env=atari: ale-py with the official settings, checked against ale-py's own env."""

import gymnasium
import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from dreamer.command_line import load
from dreamer.envs.atari import ale_id
from dreamer.envs.atari import make as make_atari
from dreamer.envs.make import make_env
from tests.runs import read_metrics, run_module, run_trainer

ale_py = pytest.importorskip("ale_py")
gymnasium.register_envs(ale_py)

RAW = {"game": "pong", "sticky": False, "actions": "minimal", "lives": "unused"}


def twin(game="pong"):
    """ale-py's own env, one frame per step, no sticky actions."""
    return gymnasium.make(ale_id(game), frameskip=1, repeat_action_probability=0.0)


def test_atari100k_spaces():
    cfg = load(["experiment=atari100k"])
    env = make_env(OmegaConf.to_container(cfg.env), seed=0)
    image = env.observation_spec["image"]
    assert tuple(image.shape) == (64, 64, 3) and str(image.dtype) == "torch.uint8"
    minimal = len(twin().unwrapped.ale.getMinimalActionSet())
    assert env.action_spec.shape[-1] == minimal < 18
    env.close()
    every = make_env({**OmegaConf.to_container(cfg.env), "actions": "all"}, seed=0)
    assert every.action_spec.shape[-1] == 18
    every.close()


def test_repeat_sums_rewards_and_pools_the_last_two_frames():
    ours = make_atari({**RAW, "noops": 0, "repeat": 4, "pooling": 2, "size": 0, "gray": False}, 3)
    theirs = twin()
    ours.reset(seed=3)
    theirs.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(60):
        action = int(rng.integers(ours.action_space.n))
        obs, reward, *_ = ours.step(action)
        frames, total = [], 0.0
        for _ in range(4):
            frame, r, *_ = theirs.step(action)
            frames.append(frame)
            total += r
        np.testing.assert_array_equal(obs["image"], np.maximum(frames[-2], frames[-1]))
        assert reward == total
    frame_number = ours.unwrapped.ale.getEpisodeFrameNumber()
    assert frame_number == theirs.unwrapped.ale.getEpisodeFrameNumber() == 240


def test_noops_take_a_seeded_random_number_of_frames_after_reset():
    ours = make_atari({**RAW, "noops": 30, "repeat": 4, "pooling": 2, "size": 0, "gray": False}, 0)
    counts = {}
    for seed in range(6):
        obs, _ = ours.reset(seed=seed)
        counts[seed] = ours.unwrapped.ale.getEpisodeFrameNumber()
        theirs = twin()
        theirs.reset(seed=seed)
        for _ in range(counts[seed]):
            frame, *_ = theirs.step(0)
        if counts[seed]:
            np.testing.assert_array_equal(obs["image"], frame)  # the frame after the no-ops
    assert all(0 <= n <= 30 for n in counts.values()) and len(set(counts.values())) > 1
    ours.reset(seed=4)
    assert ours.unwrapped.ale.getEpisodeFrameNumber() == counts[4]


def test_resize_and_gray_follow_the_official_pillow_and_luma():
    from PIL import Image

    ours = make_atari({**RAW, "noops": 0, "repeat": 1, "pooling": 1, "size": 64, "gray": True}, 0)
    theirs = twin()
    obs, _ = ours.reset(seed=1)
    frame, _ = theirs.reset(seed=1)
    resized = np.asarray(Image.fromarray(frame).resize((64, 64), Image.BILINEAR))
    expected = (resized * [0.299, 0.587, 0.114]).sum(-1).astype(np.uint8)
    assert obs["image"].shape == (64, 64, 1)
    np.testing.assert_array_equal(obs["image"][..., 0], expected)


@pytest.mark.slow
def test_atari100k_preset_smoke_run(tmp_path):
    logdir = tmp_path / "run"
    result = run_trainer(
        logdir,
        "experiment=atari100k",
        "model=tiny",
        "run.steps=128",
        "run.train_starts=96",
        "run.train_ratio=16",
        "run.log_every=32",
        "replay.batch=4",
        "replay.length=16",
        "learner.warmup=0",
        "collector.chunk=16",
        "eval.every=0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    saved = yaml.safe_load((logdir / "config.yaml").read_text())
    assert saved["env"]["repeat"] == 4 and saved["env"]["actions"] == "minimal"
    rows = read_metrics(logdir)
    assert rows[-1]["env_steps"] == 128 and rows[-1]["updates"] >= 4
    assert all(np.isfinite(rows[-1][key]) for key in rows[-1] if key.startswith("loss"))
    # that folder named for a cartpole run: the mistake is the folder, said in one line
    other = run_module("dreamer.train", "experiment=smoke", "env=cartpole", f"run.logdir={logdir}")
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr[-3000:]
    assert other.stderr == (
        f"error: run.logdir: {logdir} holds an env=atari run, not env=cartpole: "
        "give a new run.logdir for this one, or leave env out to resume that run\n"
    )
    assert read_metrics(logdir) == rows
