"""The loss (``DreamerLoss.forward``, its scans) computes torchrl's DreamerV3 losses
(``tests/torchrl_reference.py``): same losses and gradients on a fixed batch with fixed
draws and with the real random stream, for every kind of agent."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torchrl.modules.models.model_based import (
    two_hot_cross_entropy as torchrl_two_hot_cross_entropy,
)

from dreamer.agent.build import build_agent
from dreamer.agent.scans import two_hot_cross_entropy
from dreamer.command_line import load
from dreamer.data.replay import random_batch
from dreamer.learning.learner import Learner
from tests.batches import MASKED, MULTI_KEY, real_batch
from tests.compare import RTOL, losses_and_gradients, relative_error
from tests.torchrl_reference import TorchrlReference

AGENTS = {
    "vector_discrete": (["env=cartpole"], None),
    "vector_continuous": (["env=gym", "env.id=Pendulum-v1"], None),
    "pixels": (["env=crafter", "learner.imag_last=4"], None),  # from the last 4 steps
    "multi_key": ([], MULTI_KEY),
    "masked_multi_head": ([], MASKED),
}


def agent_loss(kind: str):
    """The agent kind's loss (seed 0) and a batch of the smoke shape."""
    overrides, spaces = AGENTS[kind]
    cfg = load(["experiment=smoke", *overrides])
    if spaces is None:
        spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    else:
        batch = random_batch(spaces, cfg.replay.batch, cfg.replay.length)
    torch.manual_seed(0)
    return build_agent(cfg.model, cfg.learner, spaces).loss, batch


@pytest.mark.parametrize("kind", list(AGENTS))
def test_the_losses_and_gradients_equal_torchrls(kind):
    loss, batch = agent_loss(kind)
    reference = TorchrlReference(loss)
    # fixed draws: uniforms 0.5, most likely categorical choice; and the real random
    # stream, which the scans consume in torchrl's order
    for fixed in (True, False):
        theirs, their_grads, their_buffers = losses_and_gradients(loss, reference, batch, fixed)
        ours, our_grads, our_buffers = losses_and_gradients(loss, loss, batch, fixed)
        keys = [k for k in theirs.keys() if k != "replay_context"]
        assert keys == [k for k in ours.keys() if k != "replay_context"]
        assert any(k.startswith("loss_model") for k in keys) and "loss_actor" in keys
        for key in keys:
            torch.testing.assert_close(ours[key], theirs[key], rtol=RTOL, atol=1e-7, msg=key)
        assert our_grads.keys() == their_grads.keys()
        assert len(our_grads) == len(list(loss.parameters()))  # every network learns
        for name, grad in their_grads.items():
            error = relative_error(our_grads[name], grad)
            assert error <= RTOL, (name, float(error))
        for mine, theirs_buffer in zip(our_buffers, their_buffers):
            torch.testing.assert_close(mine, theirs_buffer, rtol=RTOL, atol=1e-7)
        context = ours["replay_context"]
        torch.testing.assert_close(context["belief"], theirs["replay_context"]["belief"])


# A bf16 update's terms and gradients against the fp32 one: within this factor of the
# largest relative error torchrl's own losses make in bf16 on the same batch and weights
# (their rounding of the same products; a term of ours may round a little differently:
# up to 2x theirs seen, at most 0.27 on a gradient of these small random models)
BF16_OVER_TORCHRLS = 2.0
BF16_FLOOR = 5e-3  # terms torchrl's bf16 happens to round exactly still get this much


@pytest.mark.parametrize("kind", list(AGENTS))
def test_a_bf16_update_is_as_close_to_fp32_as_torchrls_own(kind):
    """Numerics only: a CPU without bf16 instructions emulates the same rounding."""
    loss, batch = agent_loss(kind)
    with torch.no_grad():  # heads that predict something (the reward and value start at 0)
        for parameter in loss.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    reference = TorchrlReference(loss)
    fp32, fp32_grads, _ = losses_and_gradients(loss, reference, batch, True)
    runs = {
        "torchrl": losses_and_gradients(loss, reference, batch, True, "bf16"),
        "ours": losses_and_gradients(loss, loss, batch, True, "bf16"),
    }
    keys = [key for key in fp32.keys() if isinstance(key, str) and key.startswith("loss_")]
    term_error, grad_error = {}, {}
    for name, (out, grads, _) in runs.items():
        assert out["loss_actor"].dtype == torch.float32  # terms summed in fp32
        term_error[name] = {
            key: float((out[key] - fp32[key]).abs() / fp32[key].abs().clamp_min(1e-6))
            for key in keys
        }
        grad_error[name] = max(relative_error(grads[n], g) for n, g in fp32_grads.items())
    assert max(term_error["torchrl"].values()) > 0  # bf16 did run: it rounds
    bound = max(BF16_FLOOR, BF16_OVER_TORCHRLS * max(term_error["torchrl"].values()))
    for key, error in term_error["ours"].items():
        assert error <= bound, (key, error, term_error["torchrl"])
    assert grad_error["ours"] <= BF16_OVER_TORCHRLS * grad_error["torchrl"], grad_error


def test_a_checkpoint_of_the_two_rollout_version_resumes(tmp_path):
    """A learner checkpoint and run config as the version with ``learner.rollout`` wrote
    them: the same module tree (torchrl's losses own every parameter), the removed key
    in the saved config: the config resumes and the learner loads every tensor."""
    from omegaconf import OmegaConf

    from dreamer.training.resume import check_resume, saved

    cfg = load(["experiment=smoke", "env=cartpole"])
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    config = OmegaConf.to_container(cfg)
    config["learner"]["rollout"] = "torchrl"
    OmegaConf.save(OmegaConf.create(config), tmp_path / "config.yaml")
    check_resume(config, cfg)
    assert "rollout" not in saved(tmp_path / "config.yaml").learner
    torch.manual_seed(0)
    written = Learner(build_agent(cfg.model, cfg.learner, spaces), cfg.learner, torch.device("cpu"))
    written.update(batch.clone())
    state = written.state_dict()
    torch.manual_seed(1)
    resumed = Learner(build_agent(cfg.model, cfg.learner, spaces), cfg.learner, torch.device("cpu"))
    resumed.load_state_dict(state)
    for (name, mine), theirs in zip(resumed.loss.state_dict().items(), state["loss"].values()):
        assert torch.equal(mine, theirs), name


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
    value_loss = loss.value_loss
    with torch.no_grad():  # a slow critic unlike the critic
        for slow in value_loss.target_value_model_params.values(True, True):
            slow.add_(1.0)
    critic = value_loss.value_model
    own = {name: p.detach().clone() for name, p in critic.named_parameters()}
    slow = {w.data_ptr() for w in value_loss.target_value_model_params.values(True, True)}
    with pytest.raises(raised, match="cut short"), _CutShortInSlowCritic(critic, slow, raised):
        loss(batch.clone())
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
