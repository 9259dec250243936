"""env=dmc: dm_control suite tasks, checked against dm_control's own environment."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dreamer.command_line import load
from dreamer.envs.dmc import SKYBOX, DMCEnv, choose_gl_backend, split_task
from dreamer.envs.make import make_env
from dreamer.errors import ConfigError
from dreamer.outputs import metric_keys
from dreamer.runtime import checkpoint
from tests.runs import ROOT, as_a_user, forked_runs, read_metrics, run_trainer, venv_without

pytest.importorskip("dm_control")
try:
    choose_gl_backend()  # the vision tests render in this process
except ConfigError:  # no renderer here: collected all the same, the vision tests say why
    choose_gl_backend(render=False)
from dm_control import suite  # noqa: E402  (after the GL backend is chosen)


def test_proprio_keys_are_the_suites_observations_flattened():
    cfg = load(["env=dmc", "env.task=walker_walk"])
    env = make_env(OmegaConf.to_container(cfg.env), seed=0)
    theirs = suite.load("walker", "walk").observation_spec()
    obs = {key: tuple(env.observation_spec[key].shape) for key in theirs}
    assert obs == {key: (int(np.prod(spec.shape)),) for key, spec in theirs.items()}
    assert "image" not in env.observation_spec.keys()
    assert env.action_spec.space.low.tolist() == [-1.0] * 6
    env.close()


@pytest.mark.parametrize(("task", "camera"), [("cartpole_balance", 0), ("quadruped_walk", 2)])
def test_vision_frames_come_from_the_official_camera(task, camera):
    ours = DMCEnv(task, obs="vision", size=64, seed=5)
    obs, _ = ours.reset()
    theirs = suite.load(*task.split("_", 1), task_kwargs={"random": 5})
    theirs.reset()
    expected = theirs.physics.render(64, 64, camera_id=camera)
    assert set(obs) == {"image"} and obs["image"].dtype == np.uint8
    np.testing.assert_array_equal(obs["image"], expected)


@pytest.mark.parametrize("task", ["cartpole_balance", "reacher_easy", "walker_walk"])
def test_a_proprio_env_holds_no_skybox_and_steps_as_the_suites_own(task):
    from dm_control.suite import common

    skybox = common.ASSETS[SKYBOX]
    ours = DMCEnv(task, obs="proprio", seed=3)
    assert common.ASSETS[SKYBOX] == skybox  # the suite's asset is left as it was
    theirs = suite.load(*split_task(task), task_kwargs={"random": 3})
    textures = ours._env.physics.model.tex_data.size, theirs.physics.model.tex_data.size
    assert textures[0] * 20 < textures[1], textures
    obs, _ = ours.reset()
    time_step = theirs.reset()
    actions = np.random.default_rng(0).uniform(-1, 1, (300, *theirs.action_spec().shape))
    for action in actions:
        obs, reward, *_ = ours.step(action)
        time_step = theirs.step(action)
        assert reward == time_step.reward
        for key, value in time_step.observation.items():
            np.testing.assert_array_equal(obs[key], np.asarray(value, np.float32).reshape(-1))


def test_repeat_steps_the_physics_repeat_times_and_sums_rewards():
    ours = DMCEnv("cartpole_swingup", obs="proprio", repeat=3, seed=1)
    ours.reset()
    theirs = suite.load("cartpole", "swingup", task_kwargs={"random": 1})
    theirs.reset()
    for step in range(1, 6):
        action = np.array([0.5 if step % 2 else -0.7])
        obs, reward, terminated, truncated, _ = ours.step(action)
        steps = [theirs.step(action) for _ in range(3)]
        assert reward == pytest.approx(sum(time_step.reward for time_step in steps))
        for key, value in steps[-1].observation.items():
            np.testing.assert_allclose(obs[key], np.asarray(value, np.float32).reshape(-1))
    assert not (terminated or truncated)


def test_gl_backend_is_auto_picked_and_mujoco_gl_overrides(monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    import pathlib

    expected = "egl" if pathlib.Path("/dev/nvidiactl").exists() else "osmesa"
    assert choose_gl_backend() == expected
    monkeypatch.setenv("MUJOCO_GL", "egl")
    assert choose_gl_backend() == "egl"
    monkeypatch.delenv("MUJOCO_GL")
    assert choose_gl_backend(render=False) == "disable"  # proprio: no OpenGL at all
    with pytest.raises(ConfigError, match="needs a renderer, not MUJOCO_GL=disable"):
        choose_gl_backend()


def test_a_proprio_task_that_needs_a_gl_context_gets_a_renderer():
    """quadruped_escape uploads its terrain to a GL context at each reset: with no
    renderer (what proprio picks) it raised at the first reset in every env worker."""
    probe = (
        "import json, os; os.environ.pop('MUJOCO_GL', None); import numpy as np;"
        "from dreamer.envs.dmc import DMCEnv; env = DMCEnv('quadruped_escape', seed=1);"
        "obs, _ = env.reset(); obs, reward, *_ = env.step(np.zeros(12, np.float32));"
        "print(json.dumps([os.environ['MUJOCO_GL'], sorted(obs), bool(np.isfinite(reward))]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    backend, keys, finite = json.loads(done.stdout.splitlines()[-1])
    assert backend in ("osmesa", "egl") and finite
    assert keys == sorted(suite.load("quadruped", "escape").observation_spec())


HIDE_OSMESA = """
import ctypes.util, os
os.environ.pop("MUJOCO_GL", None)
found = ctypes.util.find_library
ctypes.util.find_library = lambda name: None if name == "OSMesa" else found(name)
"""


def test_without_libosmesa_proprio_trains_and_vision_exits_2_with_the_install_line(tmp_path):
    """A machine without Debian's libosmesa6 (hidden from the trainer's processes): the
    proprio run imports no OpenGL and trains; the vision run is refused in one line."""
    probe = (
        "import os, sys; os.environ.pop('MUJOCO_GL', None); from dreamer.envs.dmc import DMCEnv;"
        "DMCEnv('cartpole_balance').reset();"
        "print(os.environ['MUJOCO_GL'], 'OpenGL' in sys.modules)"
    )
    steps = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert steps.stdout.split() == ["disable", "False"], steps.stderr[-2000:]
    common = [*SMOKE, "env.task=cartpole_balance", "run.progress=false"]
    rows = [
        ([*common, "env.obs=proprio", f"run.logdir={tmp_path / 'proprio'}"], []),
        ([*common, "env.obs=vision", f"run.logdir={tmp_path / 'vision'}"], []),
    ]
    out = tmp_path / "out"
    out.mkdir()
    proprio, vision = forked_runs(
        "dreamer.train", rows, out, prelude=HIDE_OSMESA + "import dreamer.training.loop"
    )
    assert proprio.returncode == 0, proprio.stderr[-3000:]
    assert read_metrics(tmp_path / "proprio")[-1]["env_steps"] == 128
    assert vision.returncode == 2, vision.stderr[-3000:]
    assert vision.stderr.strip().splitlines() == [
        "error: env.obs: MuJoCo's CPU renderer needs Debian's libosmesa6; install it with "
        "apt-get install libosmesa6 (or make osmesa)"
    ]
    assert not (tmp_path / "vision").exists(), "a refused run left a run directory"


SMOKE = (
    "experiment=smoke",
    "env=dmc",
    "env.length=32",
    "run.steps=128",
    "run.train_ratio=16",
    "run.train_starts=96",
    "run.log_every=32",
    "collector.chunk=16",
    "eval.every=0",
)


# vision: the driver's probe env once left its GL context to the garbage collection
# before gc.freeze(), whose __del__ hung on dm_control's render thread (the run never
# started collecting)
@pytest.mark.slow
@pytest.mark.parametrize("obs", ["proprio", "vision"])
def test_smoke_run(tmp_path, obs):
    task = "cartpole_balance"
    logdir = tmp_path / "run"
    result = run_trainer(logdir, *SMOKE, f"env.task={task}", f"env.obs={obs}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(logdir)
    assert rows[-1]["env_steps"] == 128 and rows[-1]["updates"] >= 4
    finished = [row for row in rows if "episode/return" in row]
    assert finished, "no 32-step episode finished"
    # suite rewards lie in [0, 1] per step; balance starts upright, so a random policy scores
    assert all(0 <= row["episode/return"] <= 32 for row in finished)
    if obs == "proprio":
        assert max(row["episode/return"] for row in finished) > 5
    # the world model saw RGB frames exactly when asked to: a conv encoder over 3 channels
    weights = checkpoint.load(checkpoint.latest(logdir))["learner"]["loss"].values()
    convs = [w.shape for w in weights if w.dim() == 4 and w.shape[1] == 3]
    assert bool(convs) == (obs == "vision"), convs
    assert all(torch.isfinite(torch.tensor(rows[-1][k])) for k in rows[-1] if "loss" in k)
    assert [key for row in rows for key in row if not metric_keys.documented(key)] == []
    if obs == "vision":  # evaluated by the command as a user starts it, MUJOCO_GL unset:
        # its forkserver's children render only if it chose the renderer before forking it
        arguments = ("eval.episodes=1", "eval.max_steps=20", "eval.render_workers=0")
        evaluated = subprocess.run(
            [sys.executable, "-m", "dreamer.evaluate", f"run.logdir={logdir}", *arguments],
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if k != "MUJOCO_GL"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        assert (logdir / "evaluate" / "000000000128" / "episode.mp4").exists()


@pytest.mark.slow
def test_make_train_installs_the_extra_the_chosen_env_lacks_then_trains(tmp_path):
    """The README's CPU run as typed (``make train ARGS=experiment=dmc_proprio_cpu``, here
    cut to a few steps) in a venv without dm_control and mujoco: make's trainer installs
    the dmc extra into that venv, then trains."""
    python = venv_without(tmp_path / "venv", "dm_control", "mujoco")
    assert subprocess.run([python, "-c", "import dm_control"], capture_output=True).returncode
    short = "model=tiny run.envs=2 run.steps=64 run.train_starts=48 run.log_every=32 env.length=32"
    short += " replay.batch=2 replay.length=8 collector.chunk=16 eval.every=0 run.progress=false"
    short += " learner.compile=false"  # the preset compiles: ~30 s cold, test_compile's subject
    logdir = tmp_path / "run"
    args = f"ARGS=experiment=dmc_proprio_cpu {short} run.logdir={logdir}"
    make = ["make", "-s", "-f", str(ROOT / "Makefile"), "-o", ".venv/.installed", "train"]
    done = subprocess.run(
        [*make, f"PY={python}", args],
        cwd=tmp_path, env=as_a_user(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    needs = "dm-control>=1.0.50 mujoco<4,>=3.17"  # pyproject.toml's dmc extra
    assert done.stdout.startswith(f"env: dmc needs dm_control: installing {needs}\n")
    site = subprocess.run(
        [python, "-c", "import dm_control, mujoco; print(dm_control.__file__, mujoco.__file__)"],
        capture_output=True,
        text=True,
    )
    for module in site.stdout.split():  # installed into the new venv, not linked
        assert Path(module).resolve().is_relative_to(tmp_path / "venv"), module
    assert read_metrics(logdir)[-1]["env_steps"] == 64
