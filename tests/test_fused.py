"""The fused rollout (learner.rollout=fused) computes torchrl's DreamerV3 losses: same
losses and gradients on a fixed batch with fixed draws, for every kind of agent."""

import pytest
import torch

from dreamer.agent.build import build_agent
from dreamer.agent.fused import FusedDreamerV3Loss
from dreamer.agent.masked import Head
from dreamer.agent.spaces import EnvSpaces, ObsKey
from dreamer.config import load
from dreamer.learner import Learner
from tests.batches import real_batch, synthetic_batch
from tests.ddp_updates import same_draws

RTOL = 1e-5


MULTI_KEY = EnvSpaces(
    (ObsKey("pov", (16, 16, 3), "image"), ObsKey("inventory", (7,), "vector")),
    action_dim=6,
    discrete=True,
)
MASKED = EnvSpaces(
    (
        ObsKey("pov", (16, 16, 3), "image"),
        ObsKey("mask_craft", (4,), "vector"),
        ObsKey("mask_equip", (6,), "vector"),
        ObsKey("mask_place", (6,), "vector"),
        ObsKey("mask_root", (5,), "vector"),
    ),
    action_dim=15,
    discrete=True,
    action_heads=(
        Head(5, mask="mask_root"),
        Head(4, gated_by=((2, "mask_craft"),)),
        Head(6, gated_by=((3, "mask_equip"), (4, "mask_place"))),
    ),
)

AGENTS = {
    "vector_discrete": (["env=cartpole"], None),
    "vector_continuous": (["env=gym", "env.id=Pendulum-v1"], None),
    "pixels": (["env=crafter", "learner.imag_last=4"], None),  # from the last 4 steps
    "multi_key": ([], MULTI_KEY),
    "masked_multi_head": ([], MASKED),
}


def losses_and_gradients(loss_module, stepper_loss, sample, fixed: bool):
    """One forward/backward through torchrl's stepper; the loss's buffers (return
    statistics) are put back afterwards so both paths start from the same state."""
    from torchrl.trainers.algorithms import DreamerV3OptimizationStepper

    optimizer = torch.optim.SGD(loss_module.parameters(), lr=0.0)
    stepper = DreamerV3OptimizationStepper(
        stepper_loss, optimizer, None, compile_train_step=False, cudagraph=False
    )
    saved = [b.clone() for b in loss_module.buffers()]
    for p in loss_module.parameters():
        p.grad = None
    torch.manual_seed(3)
    if fixed:
        with same_draws():
            out = stepper._forward_backward(stepper._prepare_sample(sample.clone()))
    else:
        out = stepper._forward_backward(stepper._prepare_sample(sample.clone()))
    grads = {n: p.grad.clone() for n, p in loss_module.named_parameters() if p.grad is not None}
    buffers = [b.clone() for b in loss_module.buffers()]
    with torch.no_grad():
        for b, s in zip(loss_module.buffers(), saved):
            b.copy_(s)
    return out, grads, buffers


@pytest.mark.parametrize("kind", list(AGENTS))
def test_fused_losses_and_gradients_equal_torchrls(kind):
    overrides, spaces = AGENTS[kind]
    cfg = load(["experiment=smoke", *overrides])
    if spaces is None:
        spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    else:
        batch = synthetic_batch(spaces, cfg.replay.batch, cfg.replay.length)
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
