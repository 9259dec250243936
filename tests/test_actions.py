"""Continuous actions: the actor acts in [-1, 1] per dimension and the env side rescales
each dimension to its own bounds; an infinite bound is passed through unscaled."""

import gymnasium
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torchrl.envs.utils import ExplorationType, set_exploration_type

from dreamer.agent.acting import env_action
from dreamer.agent.build import build_agent, latent_sizes
from dreamer.agent.spaces import spaces_from_env
from dreamer.command_line import load
from dreamer.envs.make import action_note, make_env

LOW, HIGH = np.array([0.0, -10.0], np.float32), np.array([5.0, 10.0], np.float32)


class RecordingBox(gymnasium.Env):
    """Records every action it receives; bounds [0, 5] x [-10, 10] unless told."""

    received: list[np.ndarray] = []

    def __init__(self, low=LOW, high=HIGH):
        self.action_space = gymnasium.spaces.Box(low, high, dtype=np.float32)
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        RecordingBox.received.append(np.array(action, dtype=np.float64))
        return np.zeros(3, np.float32), 0.0, False, False, {}


gymnasium.register("DreamerTest/RecordingBox-v0", entry_point=RecordingBox)
gymnasium.register(
    "DreamerTest/UnboundedBox-v0",
    entry_point=RecordingBox,
    kwargs={"low": np.float32([-np.inf, 0.0]), "high": np.float32([np.inf, 1.0])},
)


@pytest.fixture
def agent_env():
    cfg = load(["experiment=smoke", "env=gym", "env.id=DreamerTest/RecordingBox-v0"])
    env = make_env(OmegaConf.to_container(cfg.env), seed=0, latent=latent_sizes(cfg.model))
    torch.manual_seed(0)
    agent = build_agent(cfg.model, cfg.learner, spaces_from_env(env))
    RecordingBox.received.clear()
    yield agent, env
    env.close()


def test_sampled_actions_span_each_dimensions_own_range_and_never_leave_it(agent_env):
    agent, env = agent_env
    assert env.action_spec.space.low.tolist() == [-1.0, -1.0]
    assert env.action_spec.space.high.tolist() == [1.0, 1.0]
    with set_exploration_type(ExplorationType.RANDOM), torch.no_grad():
        rollout = env.rollout(300, agent.policy, break_when_any_done=False)
    received = np.stack(RecordingBox.received)
    assert (received >= LOW).all() and (received <= HIGH).all()
    np.testing.assert_allclose(received.min(0), LOW, atol=1e-5)
    np.testing.assert_allclose(received.max(0), HIGH, atol=1e-5)
    # replay keeps the actor's own [-1, 1] action, the env got it rescaled per dimension
    agent_side = rollout["action"].clamp(-1, 1).double().numpy()
    np.testing.assert_allclose(received, LOW + (agent_side + 1) / 2 * (HIGH - LOW), atol=1e-4)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_greedy_actions_reach_both_ends(agent_env, sign):
    agent, env = agent_env
    actor_net = agent.actor[0].module
    with torch.no_grad():
        actor_net.mean.weight.zero_()
        actor_net.mean.bias.fill_(sign * 20.0)  # tanh saturates: the mode is +-1
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        env.rollout(5, agent.policy, break_when_any_done=False)
    received = np.stack(RecordingBox.received)
    np.testing.assert_allclose(received, np.broadcast_to(HIGH if sign > 0 else LOW, received.shape))


def test_an_infinite_bound_passes_actions_unscaled_with_a_warning():
    env = make_env({"name": "gym", "id": "DreamerTest/UnboundedBox-v0", "length": 0}, seed=0)
    RecordingBox.received.clear()
    env.rollout(3, lambda td: td.set("action", torch.tensor([0.5, -0.25])))
    np.testing.assert_allclose(np.stack(RecordingBox.received), [[0.5, -0.25]] * 3)
    note = action_note(env)
    assert note is not None and "unscaled" in note and "\n" not in note
    env.close()


def test_the_act_api_gives_the_env_the_actions_the_collector_path_gives(agent_env):
    """``env_action`` (what ``dreamer.Policy`` and the exported program return) rescales
    the actor's action exactly as the env side does; an unbounded box stays unscaled."""
    agent, env = agent_env
    spaces = spaces_from_env(env)
    assert spaces.action_low == tuple(LOW) and spaces.action_high == tuple(HIGH)
    with set_exploration_type(ExplorationType.RANDOM), torch.no_grad():
        rollout = env.rollout(50, agent.policy, break_when_any_done=False)
    acted = env_action(rollout["action"], spaces).double().numpy()
    np.testing.assert_allclose(acted, np.stack(RecordingBox.received), atol=1e-4)
    unbounded = make_env({"name": "gym", "id": "DreamerTest/UnboundedBox-v0", "length": 0}, 0)
    action = torch.tensor([3.0, -0.5])
    assert torch.equal(env_action(action, spaces_from_env(unbounded)), action)
    unbounded.close()
