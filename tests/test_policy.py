"""Acting with a trained run: ``dreamer.Policy``, the README example, the exported
program in an interpreter without dreamer, and bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict.nn import InteractionType, set_interaction_type

from dreamer import Policy
from dreamer.agent.acting import env_action
from dreamer.agent.build import build_agent, latent_sizes
from dreamer.agent.spaces import spaces_to_dict
from dreamer.command_line import load
from dreamer.envs.make import describe_env, env_config, make_env
from dreamer.export import main as export_main
from dreamer.runtime import checkpoint
from tests.runs import forked_runs, run_module, run_trainer

STANDINS = Path(__file__).resolve().parent / "standins"
README = Path(__file__).resolve().parent.parent / "docs" / "policy.md"
CARTPOLE = ["experiment=smoke", "env=cartpole", "run.train_starts=200", "eval.every=0"]
# (config overrides, gymnasium env factory) per environment kind
ENVS = {
    "cartpole": (["env=cartpole"], lambda tmp: gym.make("CartPole-v1")),
    "pendulum": (["env=gym", "env.id=Pendulum-v1"], lambda tmp: gym.make("Pendulum-v1")),
    "crafter": (["env=crafter", "env.length=40"], None),
    "minedojo": (["env=minedojo", "env.task=open-ended", "env.max_steps=40"], None),
}


@pytest.fixture(autouse=True)
def minedojo_standin(monkeypatch):
    monkeypatch.setenv("MINEDOJO_STANDIN_LAUNCH_SECONDS", "0")
    monkeypatch.syspath_prepend(str(STANDINS))


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    logdir = tmp_path_factory.mktemp("policy") / "cartpole"
    result = run_trainer(logdir, *CARTPOLE, "run.steps=300", "run.log_every=100")
    assert result.returncode == 0, result.stderr[-3000:]
    return logdir


@pytest.fixture(scope="module")
def exported_cartpole(cartpole_run, tmp_path_factory) -> tuple[Path, list[str]]:
    """docs/policy.md's export command on the trained run (its path the one thing
    changed), run in a folder of its own: (that folder, holding policy.pt2; the command)."""
    text = README.read_text()
    command = re.search(r"after `(python -m dreamer.export[^`]*)`", text, re.S)[1].split()
    command = [arg.replace("runs/cartpole/my-run", str(cartpole_run)) for arg in command]
    folder = tmp_path_factory.mktemp("exported")
    exported = subprocess.run(
        [sys.executable, *command[1:]], capture_output=True, text=True, cwd=folder, timeout=300
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "exported the greedy policy" in exported.stdout
    return folder, command


def gym_env(kind: str, tmp_path: Path) -> gym.Env:
    if kind == "crafter":
        from dreamer.envs.crafter import CrafterEnv

        return CrafterEnv(size=64, length=40, seed=3)
    if kind == "minedojo":
        from dreamer.envs.minedojo import MineDojoEnv

        lock = str(tmp_path / "launch.lock")
        return MineDojoEnv(task="open-ended", launch_lock=lock, seed=1, max_steps=40)
    return ENVS[kind][1](tmp_path)


def untrained_run(logdir: Path, kind: str):
    """A run directory whose checkpoint holds a freshly built tiny agent (no training:
    these tests are about the acting path, not what was learned). Returns the agent
    and the env config node."""
    cfg = load(["model=tiny", *ENVS[kind][0], f"run.logdir={logdir}"])
    env = env_config(OmegaConf.to_container(cfg.env), logdir)
    spaces, _ = describe_env(env, 0)
    torch.manual_seed(5)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    with torch.no_grad():  # sharper actor logits than at init, so greedy choices vary
        for parameter in agent.actor.parameters():
            parameter.mul_(30)
    state = {
        "learner": {"loss": agent.loss.state_dict()},
        "config": OmegaConf.to_container(cfg),
        "steps": {"env_steps": 7},
        "spaces": spaces_to_dict(spaces),
    }
    checkpoint.save(logdir, 7, state)
    return agent, env, cfg


@pytest.mark.parametrize("kind", ["crafter", "pendulum", "minedojo"])
def test_act_gives_the_collectors_policy_actions(tmp_path, kind):
    """Policy.act, built from encoder, RSSM cell and actor alone, acts as the full
    agent's policy does in a torchrl env rollout (the collector's path), same seed."""
    agent, env, cfg = untrained_run(tmp_path / "run", kind)
    torchrl_env = make_env(env, 11, latent_sizes(cfg.model))
    torch.manual_seed(0)
    with torch.no_grad(), set_interaction_type(InteractionType.DETERMINISTIC):
        rollout = torchrl_env.rollout(12, agent.policy, break_when_any_done=False)
    torchrl_env.close()
    policy = Policy.load(tmp_path / "run")
    assert policy.step == 7
    assert not hasattr(policy.module, "loss")
    names = [key.name for key in policy.spaces.obs]
    torch.manual_seed(0)
    state, acted = None, []
    for t in range(rollout.shape[0]):
        obs = {name: rollout[name][t].numpy() for name in names}  # as numpy, one env
        if t and rollout["is_init"][t].item():
            state = policy.reset(state, [True])
        action, state = policy.act(obs, state)
        acted.append(np.asarray(action))
    expected = env_action(rollout["action"], policy.spaces).numpy()
    if policy.spaces.discrete:
        np.testing.assert_array_equal(np.stack(acted).reshape(expected.shape), expected)
    else:
        np.testing.assert_allclose(np.stack(acted), expected, atol=1e-5)
        assert not np.allclose(expected, expected[0]), "actions should vary with observations"


@pytest.mark.parametrize("kind", ["crafter", "pendulum", "minedojo", "cartpole"])
def test_act_drives_the_gymnasium_env_one_env_and_a_batch(tmp_path, kind):
    untrained_run(tmp_path / "run", kind)
    policy = Policy.load(tmp_path / "run" / "checkpoints")
    envs = [gym_env(kind, tmp_path / str(i)) for i in range(2)]
    observations = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    single_state, batch_state = None, None
    for _ in range(6):
        action, single_state = policy.act(observations[0], single_state, mode="sample")
        assert envs[0].action_space.contains(
            np.asarray(action, envs[0].action_space.dtype).reshape(envs[0].action_space.shape)
        )
        if isinstance(observations[0], dict):
            batch = {key: np.stack([o[key] for o in observations]) for key in observations[0]}
        else:
            batch = np.stack(observations)
        actions, batch_state = policy.act(batch, batch_state)
        assert len(actions) == 2 and batch_state.batch_size == (2,)
        done = []
        for i, env in enumerate(envs):
            observations[i], _, terminated, truncated, _ = env.step(actions[i])
            done.append(terminated or truncated)
            if done[-1]:
                observations[i], _ = env.reset()
        batch_state = policy.reset(batch_state, done)
        assert batch_state["is_init"].tolist() == done
    for env in envs:
        env.close()
    if isinstance(batch, dict):
        actions, _ = policy.act({key: torch.as_tensor(value) for key, value in batch.items()})
    else:
        actions, _ = policy.act(torch.as_tensor(batch))
    assert isinstance(actions, torch.Tensor) and actions.shape[0] == 2


def readme_example() -> str:
    text = README.read_text()
    match = re.search(r"<!-- policy-example -->\n```python\n(.*?)```", text, re.S)
    assert match, "docs/policy.md lost its policy example"
    example = match.group(1)
    assert len(example.strip().splitlines()) <= 13
    return example


@pytest.mark.slow
def test_readme_example_runs_a_trained_cartpole_run(cartpole_run, tmp_path):
    example = readme_example().replace('"runs/cartpole/my-run"', repr(str(cartpole_run)))
    result = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    total = float(result.stdout.strip().split()[-1])
    assert total == int(total) and 1 <= total <= 500  # CartPole: +1 per step, capped at 500


@pytest.mark.slow
def test_the_export_example_runs_as_written_without_dreamer(exported_cartpole, cartpole_run):
    """docs/policy.md's exported example, after the export command it names, in an
    interpreter without dreamer: it builds its inputs from dreamer.json alone (the
    example used prev_action where the file says previous_action, and gave widths where
    the inputs need shapes)."""
    folder, command = exported_cartpole
    assert command[:3] == ["python", "-m", "dreamer.export"] and "export.path=policy.pt2" in command
    text = README.read_text()
    example = re.search(r"<!-- export-example -->\n```python\n(.*?)```", text, re.S)[1]
    without_dreamer = "import sys\nsys.modules['dreamer'] = None\n" + example
    result = subprocess.run(
        [sys.executable, "-I", "-c", without_dreamer],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    total = float(result.stdout.strip().split()[-1])
    assert total == int(total) and 1 <= total <= 500  # CartPole: +1 per step, capped at 500
    files = {"dreamer.json": ""}
    torch.export.load(folder / "policy.pt2", extra_files=files)
    meta = json.loads(files["dreamer.json"])
    sizes = [Policy.load(cartpole_run).state_size, Policy.load(cartpole_run).belief_size]
    for side in ("inputs", "outputs"):
        assert meta[side]["state"] == {"shape": ["B", sizes[0]], "dtype": "float32"}
        assert meta[side]["belief"] == {"shape": ["B", sizes[1]], "dtype": "float32"}
        assert meta[side]["previous_action"] == {"shape": ["B", 2], "dtype": "float32"}
    assert meta["inputs"]["is_init"] == {"shape": ["B"], "dtype": "bool"}
    assert meta["outputs"]["action"] == {"shape": ["B"], "dtype": "int64"}  # an index
    assert meta["inputs"]["obs"] == {"observation": {"shape": ["B", 4], "dtype": "float32"}}
    assert list(meta["outputs"]) == ["action", "state", "belief", "previous_action"]
    assert "prev_action" not in text


PLAY_EXPORTED = """
import sys
import torch
sys.modules["dreamer"] = None  # this interpreter has no dreamer
try:
    import dreamer
except ImportError:
    pass
else:
    raise SystemExit("dreamer is importable")
program = torch.export.load(sys.argv[1]).module()
episode = torch.load(sys.argv[2])
state, belief, previous = (torch.zeros(1, n) for n in episode["sizes"])
torch.manual_seed(episode["seed"])
actions = []
for t, is_init in enumerate(episode["is_init"]):
    obs = {name: value[t : t + 1] for name, value in episode["obs"].items()}
    action, state, belief, previous = program(obs, state, belief, previous, is_init.reshape(1))
    actions.append(action)
torch.save(torch.cat(actions).detach(), sys.argv[3])
batch = {name: value[:3] for name, value in episode["obs"].items()}
zeros = [torch.zeros(3, n) for n in episode["sizes"]]
print(tuple(program(batch, *zeros, torch.ones(3, dtype=torch.bool))[0].shape))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["cartpole-trained", "pendulum", "minedojo"])
def test_exported_policy_acts_as_policy_act_without_dreamer(
    cartpole_run, exported_cartpole, tmp_path, kind
):
    """The trained run exported by the command line (docs/policy.md's), the untrained
    ones in-process (faster)."""
    if kind == "cartpole-trained":
        logdir, kind = cartpole_run, "cartpole"
        exported = exported_cartpole[0] / "policy.pt2"
    else:
        logdir, exported = tmp_path / "run", tmp_path / "policy.pt2"
        untrained_run(logdir, kind)
        assert export_main([f"run.logdir={logdir}", f"export.path={exported}"]) == 0
    assert exported.stat().st_size > 0
    policy = Policy.load(logdir)
    env = gym_env(kind, tmp_path)
    obs, _ = env.reset(seed=4)
    torch.manual_seed(21)
    state, start, recorded, actions, is_init = None, True, [], [], []
    for _ in range(30):
        action, state = policy.act(obs, None if start else state)
        recorded.append(obs if isinstance(obs, dict) else {policy.spaces.obs[0].name: obs})
        actions.append(np.asarray(action))
        is_init.append(start)
        obs, _, terminated, truncated, _ = env.step(action)
        start = terminated or truncated
        if start:
            obs, _ = env.reset()
    env.close()
    episode = {
        "obs": {
            key.name: torch.as_tensor(np.stack([o[key.name] for o in recorded])).reshape(
                len(recorded), *key.shape
            )
            for key in policy.spaces.obs
        },
        "is_init": torch.tensor(is_init),
        "sizes": [policy.state_size, policy.belief_size, policy.spaces.action_dim],
        "seed": 21,
    }
    for name, value in episode["obs"].items():  # the dtypes the program was exported with
        if value.dtype == torch.float64:
            episode["obs"][name] = value.float()
    torch.save(episode, tmp_path / "episode.pt")
    played = subprocess.run(
        [sys.executable, "-I", "-c", PLAY_EXPORTED, str(exported), "episode.pt", "actions.pt"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert played.returncode == 0, played.stderr[-3000:]
    assert played.stdout.strip().splitlines()[-1].startswith("(3")
    exported_actions = torch.load(tmp_path / "actions.pt").numpy()
    expected = np.stack(actions).reshape(exported_actions.shape)
    if policy.spaces.discrete:
        np.testing.assert_array_equal(exported_actions, expected)
    else:
        np.testing.assert_allclose(exported_actions, expected, atol=1e-5)


def test_bad_checkpoint_paths_are_one_line_errors(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="no such checkpoint"):
        Policy.load(tmp_path / "missing")
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint in it"):
        Policy.load(tmp_path)
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(checkpoint.CheckpointError, match="not a readable checkpoint"):
        Policy.load(junk)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(checkpoint.CheckpointError, match="not a dreamer checkpoint"):
        Policy.load(tmp_path / "other.pt")
    for args, named in (
        ([f"run.logdir={tmp_path / 'missing'}"], "no such checkpoint"),
        ([f"run.logdir={tmp_path}", f"export.checkpoint={junk}"], "not a readable checkpoint"),
        (
            [f"run.logdir={tmp_path}", "export.format=onnx"],
            "export.format: not a key of this command",
        ),
    ):
        result = run_module("dreamer.export", *args)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1 and named in result.stderr


def test_import_dreamer_stays_cheap():
    code = "import sys, dreamer; print([m for m in ('torch', 'torchrl') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def _loss_entries(logdir: Path, fragment: str) -> dict[str, torch.Tensor]:
    loss = checkpoint.load(checkpoint.latest(logdir))["learner"]["loss"]
    return {name: value for name, value in loss.items() if fragment in name}


@pytest.mark.slow
def test_warm_start_takes_the_chosen_parts_and_starts_empty(cartpole_run, tmp_path):
    logdir = tmp_path / "warm"
    result = run_trainer(
        logdir,
        *CARTPOLE,
        "run.steps=100",
        "run.train_starts=1000",  # no update: the checkpoint holds the first weights
        f"run.from_checkpoint={cartpole_run}",
        "run.from_checkpoint_parts=[world_model,critic]",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warm start from" in result.stderr and "world_model, critic" in result.stderr
    state = checkpoint.load(checkpoint.latest(logdir))
    assert state["steps"]["env_steps"] == 100 and state["learner"]["updates"] == 0
    assert int(state["replay"]["written"].sum()) == 100  # this run's steps only: replay began empty
    for fragment, same in (
        ("model_loss.", True),
        ("value_loss.value_model", True),
        ("actor_model", False),
    ):
        source, warm = _loss_entries(cartpole_run, fragment), _loss_entries(logdir, fragment)
        assert source and source.keys() == warm.keys()
        equal = all(torch.equal(source[name], warm[name]) for name in source)
        assert equal == same, fragment


@pytest.mark.slow
def test_warm_start_refuses_another_layout_or_a_non_checkpoint(cartpole_run, tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00" * 64)
    refusals = [
        (
            ["env=gym", "env.id=Pendulum-v1"],
            "observation 'observation': vector (4,) vs vector (3,)",
        ),
        (["env=cartpole", "model.deter=128"], "model.deter 64 there, 128 here"),
        (["env=cartpole", f"run.from_checkpoint={junk}"], "not a readable checkpoint"),
    ]
    rows, folders = [], []
    for index, (overrides, _) in enumerate(refusals):
        logdir = tmp_path / f"refused{index}"
        argv = ["experiment=smoke", *overrides]
        if not any(o.startswith("run.from_checkpoint=") for o in overrides):
            argv.append(f"run.from_checkpoint={cartpole_run}")
        rows.append(([*argv, f"run.logdir={logdir}", "run.progress=false"], []))
        folders.append(logdir)
    out = tmp_path / "out"
    out.mkdir()
    # each a process of its own, forked from one interpreter that imported the trainer
    done = forked_runs("dreamer.train", rows, out)
    for logdir, result, (_, named) in zip(folders, done, refusals):
        assert result.returncode == 2, result.stderr[-2000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: run.from_checkpoint:") and named in last, last
        assert not logdir.exists()
