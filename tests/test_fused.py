"""The fused rollout (learner.rollout=fused) computes torchrl's DreamerV3 losses: same
losses and gradients on a fixed batch with fixed draws, for every kind of agent."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torchrl.modules.models.model_based import (
    two_hot_cross_entropy as torchrl_two_hot_cross_entropy,
)

from dreamer.agent.build import build_agent
from dreamer.config import load
from dreamer.data.replay import random_batch
from dreamer.learning.fused import FusedDreamerV3Loss, two_hot_cross_entropy
from dreamer.learning.learner import Learner
from tests.batches import MASKED, MULTI_KEY, real_batch
from tests.compare import RTOL, losses_and_gradients

AGENTS = {
    "vector_discrete": (["env=cartpole"], None),
    "vector_continuous": (["env=gym", "env.id=Pendulum-v1"], None),
    "pixels": (["env=crafter", "learner.imag_last=4"], None),  # from the last 4 steps
    "multi_key": ([], MULTI_KEY),
    "masked_multi_head": ([], MASKED),
}


@pytest.mark.parametrize("kind", list(AGENTS))
def test_fused_losses_and_gradients_equal_torchrls(kind):
    overrides, spaces = AGENTS[kind]
    cfg = load(["experiment=smoke", *overrides])
    if spaces is None:
        spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    else:
        batch = random_batch(spaces, cfg.replay.batch, cfg.replay.length)
    torch.manual_seed(0)
    loss = build_agent(cfg.model, cfg.learner, spaces).loss
    fused = FusedDreamerV3Loss(loss)
    # fixed draws: uniforms 0.5, most likely categorical choice; and the real random
    # stream, which the fused path consumes in torchrl's order
    for fixed in (True, False):
        theirs, their_grads, their_buffers = losses_and_gradients(loss, loss, batch, fixed)
        ours, our_grads, our_buffers = losses_and_gradients(loss, fused, batch, fixed)
        keys = [k for k in theirs.keys() if k != "replay_context"]
        assert keys == [k for k in ours.keys() if k != "replay_context"]
        assert any(k.startswith("loss_model") for k in keys) and "loss_actor" in keys
        for key in keys:
            torch.testing.assert_close(ours[key], theirs[key], rtol=RTOL, atol=1e-7, msg=key)
        assert our_grads.keys() == their_grads.keys()
        assert len(our_grads) == len(list(loss.parameters()))  # every network learns
        for name, grad in their_grads.items():
            error = (our_grads[name] - grad).norm() / grad.norm().clamp_min(1e-12)
            assert error <= RTOL, (name, float(error))
        for mine, theirs_buffer in zip(our_buffers, their_buffers):
            torch.testing.assert_close(mine, theirs_buffer, rtol=RTOL, atol=1e-7)
        context = ours["replay_context"]
        torch.testing.assert_close(context["belief"], theirs["replay_context"]["belief"])


def test_a_torchrl_rollout_checkpoint_resumes_under_fused():
    base = ["experiment=smoke", "env=cartpole"]
    cfg = load([*base, "learner.rollout=torchrl"])
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    torch.manual_seed(0)
    written = Learner(build_agent(cfg.model, cfg.learner, spaces), cfg.learner, torch.device("cpu"))
    written.update(batch.clone())
    saved = written.state_dict()
    fused_cfg = load(base)
    assert fused_cfg.learner.rollout == "auto"  # the default: fused on the CPU
    torch.manual_seed(1)
    resumed = Learner(
        build_agent(fused_cfg.model, fused_cfg.learner, spaces),
        fused_cfg.learner,
        torch.device("cpu"),
    )
    assert resumed.fused and not written.fused
    assert resumed.state_dict()["loss"].keys() == saved["loss"].keys()
    resumed.load_state_dict(saved)
    torch.manual_seed(5)
    ours = resumed.update(batch.clone())
    torch.manual_seed(5)
    theirs = written.update(batch.clone())
    for key in ("loss_model_reco", "loss_actor", "loss_value"):
        assert float(ours[key]) == pytest.approx(float(theirs[key]), rel=RTOL)
    # the normalised optimizer step turns last-bit gradient differences on near-zero
    # gradients into up to one learning-rate step; fresh weights would be far apart
    for p, q in zip(resumed.loss.parameters(), written.loss.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=2 * cfg.learner.lr)


class _CutShortInSlowCritic(TorchFunctionMode):
    """Raises ``raised`` at the first torch function handed one of the slow weights
    (their ``data_ptr``s) while they sit in ``critic``."""

    def __init__(self, critic, slow: set[int], raised):
        super().__init__()
        self.critic, self.slow, self.raised = critic, slow, raised

    def __torch_function__(self, func, types, args=(), kwargs=None):
        handed = any(isinstance(a, torch.Tensor) and a.data_ptr() in self.slow for a in args)
        if handed and all(w.data_ptr() in self.slow for w in self.critic.parameters()):
            raise self.raised("cut short inside the slow critic")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("raised", [KeyboardInterrupt, ValueError])
def test_the_critic_keeps_its_own_weights_when_the_slow_critic_is_cut_short(raised):
    """Ctrl-C (or an error) while the slow critic's weights sit in the critic: the same
    exception reaches the loop, and the critic the run checkpoints is its own."""
    cfg = load(["experiment=smoke", "env=cartpole"])
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    torch.manual_seed(0)
    loss = build_agent(cfg.model, cfg.learner, spaces).loss
    fused = FusedDreamerV3Loss(loss)
    value_loss = loss.value_loss
    with torch.no_grad():  # a slow critic unlike the critic
        for slow in value_loss.target_value_model_params.values(True, True):
            slow.add_(1.0)
    critic = value_loss.value_model
    own = {name: p.detach().clone() for name, p in critic.named_parameters()}
    slow = {w.data_ptr() for w in value_loss.target_value_model_params.values(True, True)}
    with pytest.raises(raised, match="cut short"), _CutShortInSlowCritic(critic, slow, raised):
        fused(batch.clone())
    weights = dict(critic.named_parameters())
    assert weights.keys() == own.keys()  # its Parameters, which the optimizer steps
    for name, weight in weights.items():
        torch.testing.assert_close(weight, own[name], rtol=0, atol=0, msg=name)
        assert weight.data_ptr() not in slow, name


def test_the_two_hot_cross_entropy_equals_torchrls_to_the_bit():
    """Values and gradients, on targets inside, on, between and beyond the bins."""
    torch.manual_seed(0)
    bins = torch.linspace(-20.0, 20.0, 255)
    logits = torch.randn(16, 15, 255, requires_grad=True)
    target = torch.randn(16, 15) * 8
    target[0, :5] = bins[[0, 3, 100, 128, 254]]
    target[1, :3] = torch.tensor([-50.0, 50.0, 1e-7])
    found = []
    for entropy in (torchrl_two_hot_cross_entropy, two_hot_cross_entropy):
        logits.grad = None
        for shape in (target.shape, (*target.shape, 1)):  # with a trailing 1 too
            value = entropy(logits, target.reshape(shape), bins)
        value.sum().backward()
        found.append((value.detach(), logits.grad.clone()))
    (their_value, their_grad), (our_value, our_grad) = found
    assert torch.equal(our_value, their_value)
    assert torch.equal(our_grad, their_grad)
