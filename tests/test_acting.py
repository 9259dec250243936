"""The acting policy's tensor path (dreamer/agent/acting.py: ``ActingPolicy``) against
torchrl's own path through the same modules: the same entries, bit for bit, and the same
random draws, for every kind of agent, episodes starting or going on; under any other
interaction type it is torchrl's path."""

import pytest
import torch
from tensordict.nn import TensorDictSequential
from torchrl.envs.utils import ExplorationType, set_exploration_type

from dreamer.agent.acting import ActingPolicy
from dreamer.agent.build import build_acting, latent_sizes
from dreamer.command_line import load
from dreamer.data.replay import random_batch
from dreamer.envs.make import probe_env
from tests.test_fused import AGENTS


def policy_and_requests(kind: str, envs: int = 3):
    """The kind's acting policy (seed 0) and a batch of requests as the inference server
    gets them: observations, the carried latent, the first env starting an episode."""
    overrides, spaces = AGENTS[kind]
    cfg = load(["experiment=smoke", *overrides])
    if spaces is None:
        spaces = probe_env(cfg.env, 0, latent_sizes(cfg.model)).spaces
    torch.manual_seed(0)
    policy = build_acting(cfg.model, spaces)
    batch = random_batch(spaces, envs, 1)[:, 0]  # observations as the replay holds them
    requests = batch["next"].select(*(key.name for key in spaces.obs))
    state_size, deter = latent_sizes(cfg.model)
    requests["state"] = torch.randn(envs, state_size)
    requests["belief"] = torch.randn(envs, deter)
    requests["previous_action"] = torch.randn(envs, spaces.action_dim)
    requests["is_init"] = torch.arange(envs) == 0
    return policy, requests


def torchrls(policy: ActingPolicy, requests):
    return TensorDictSequential.forward(policy, requests)


@pytest.mark.parametrize("kind", list(AGENTS))
def test_sampling_draws_and_writes_what_torchrls_path_does(kind):
    policy, requests = policy_and_requests(kind)
    assert isinstance(policy, ActingPolicy)
    outputs, streams = [], []
    for act in (policy, lambda td: torchrls(policy, td)):
        torch.manual_seed(1)
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            outputs.append(act(requests.clone()))
        streams.append(torch.get_rng_state())
    ours, theirs = outputs
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    for key in theirs.keys(True, True):
        assert torch.equal(ours[key], theirs[key]), key
    assert torch.equal(*streams)  # as many draws: the next step samples alike too
    # the draw is a sample, not the mode: another seed acts otherwise somewhere
    torch.manual_seed(2)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        other = policy(requests.clone())
    assert not torch.equal(other["state"], ours["state"])


@pytest.mark.parametrize("kind", ["vector_discrete", "vector_continuous"])
def test_the_mode_runs_torchrls_path(kind, monkeypatch):
    policy, requests = policy_and_requests(kind)
    called = []
    forward = TensorDictSequential.forward
    monkeypatch.setattr(
        TensorDictSequential, "forward", lambda *a, **k: called.append(1) or forward(*a, **k)
    )
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        policy(requests.clone())
    assert called
