"""``learner.loss_scales``, ``free_nats``, ``slowreg`` and ``imag_last`` reach the
DreamerV3 loss, ours and torchrl's reference alike: changing one moves exactly its term,
in the value and in the gradient of the total the stepper minimises, and nothing else."""

import pytest
import torch
from torchrl.trainers.algorithms import DreamerV3OptimizationStepper

from dreamer.agent.build import build_agent
from dreamer.command_line import load
from dreamer.config import LossScales
from tests.batches import real_batch
from tests.ddp_updates import same_draws
from tests.torchrl_reference import TorchrlReference

BASE = ["experiment=smoke", "env=cartpole"]
ROLLOUTS = ["ours", "torchrl"]
# each scale of learner.loss_scales and the loss entry it weighs
TERMS = {
    "rec": "loss_model_reco",
    "rew": "loss_model_reward",
    "con": "loss_model_continue",
    "dyn": "loss_model_dynamic",
    "rep": "loss_model_representation",
    "policy": "loss_actor",
    "value": "loss_value",
    "repval": "loss_replay_value",
}


def prepared(module, loss, batch):
    """The batch as torchrl's stepper hands it to the loss."""
    stepper = DreamerV3OptimizationStepper(
        module,
        torch.optim.SGD(loss.parameters(), lr=0.0),
        None,
        compile_train_step=False,
        cudagraph=False,
    )
    return stepper._prepare_sample(batch.clone())


@pytest.fixture(scope="module")
def data():
    cfg = load(BASE)
    return real_batch(cfg, cfg.replay.batch, cfg.replay.length)


def forward(data, rollout: str, *overrides: str, perturbed: bool = False):
    """A fresh agent (seed 0) built from the config with ``overrides``; its loss entries
    on the batch with fixed draws, and its parameters. The total is what torchrl's
    stepper minimises: the sum of the ``loss_*`` entries. ``perturbed``: noise on every
    weight, so that the reward and value heads (zero at first) predict something."""
    spaces, batch = data
    cfg = load([*BASE, *overrides])
    torch.manual_seed(0)
    loss = build_agent(cfg.model, cfg.learner, spaces).loss
    if perturbed:
        with torch.no_grad():
            for parameter in loss.parameters():
                parameter.add_(0.1 * torch.randn_like(parameter))
    module = loss if rollout == "ours" else TorchrlReference(loss)
    sample = prepared(module, loss, batch)
    torch.manual_seed(1)
    with same_draws():
        out = module(sample)
    entries = {k: v for k, v in out.items() if isinstance(k, str) and k != "replay_context"}
    return entries, list(loss.parameters()), out


def gradient(value: torch.Tensor, params, retain: bool = False) -> list[torch.Tensor]:
    grads = torch.autograd.grad(value, params, retain_graph=retain, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def total(entries: dict) -> torch.Tensor:
    return sum(v for k, v in entries.items() if k.startswith("loss_"))


def assert_same_gradients(ours: list, theirs: list) -> None:
    for index, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
        error = (mine - other).norm() / other.norm().clamp_min(1e-6)
        assert error <= 1e-5, (index, float(error))


@pytest.fixture(scope="module", params=ROLLOUTS)
def defaults(request, data):
    """Per rollout: the default entries, the total's gradient and each scaled term's own
    gradient (its contribution at the default scale)."""
    entries, params, _ = forward(data, request.param)
    term_grads = {key: gradient(entries[key], params, retain=True) for key in TERMS.values()}
    return request.param, entries, gradient(total(entries), params), term_grads


def test_the_scales_are_the_official_ones():
    assert vars(LossScales()) == {
        "rec": 1.0,
        "rew": 1.0,
        "con": 1.0,
        "dyn": 1.0,
        "rep": 0.1,
        "policy": 1.0,
        "value": 1.0,
        "repval": 0.3,
    }


@pytest.mark.parametrize("scale", list(TERMS))
def test_doubling_a_scale_doubles_its_term_alone(scale, data, defaults):
    rollout, before, before_grads, term_grads = defaults
    doubled = 2 * getattr(LossScales(), scale)
    after, params, _ = forward(data, rollout, f"learner.loss_scales.{scale}={doubled}")
    term = TERMS[scale]
    assert after.keys() == before.keys()
    assert before[term] != 0
    torch.testing.assert_close(after[term], 2 * before[term], rtol=1e-6, atol=0)
    for key in before:
        if key != term:
            assert torch.equal(after[key], before[key]), key
    # the total's gradient gains the term's own gradient once more
    expected = [g + extra for g, extra in zip(before_grads, term_grads[term])]
    assert_same_gradients(gradient(total(after), params), expected)
    assert any(g.norm() > 0 for g in term_grads[term])


@pytest.mark.parametrize("rollout", ROLLOUTS)
def test_kl_under_free_nats_costs_nothing(rollout, data):
    """Each step's KL is clipped below at free_nats: far above any KL, both KL terms
    are free_nats times their scale and give no gradient, as with scales of zero."""
    clipped, params, _ = forward(data, rollout, "learner.free_nats=1000")
    assert clipped["loss_model_dynamic"].item() == 1000.0
    torch.testing.assert_close(clipped["loss_model_representation"], torch.tensor(100.0))
    without, same_params, _ = forward(
        data, rollout, "learner.loss_scales.dyn=0", "learner.loss_scales.rep=0"
    )
    assert_same_gradients(gradient(total(clipped), params), gradient(total(without), same_params))
    for key in clipped:
        if key not in ("loss_model_dynamic", "loss_model_representation"):
            assert torch.equal(clipped[key], without[key]), key
    # without the floor the KL is the model's own, which the default floor of 1 raises
    unclipped, _, _ = forward(data, rollout, "learner.free_nats=0")
    default, _, _ = forward(data, rollout)
    assert unclipped["loss_model_dynamic"] < default["loss_model_dynamic"]
    assert unclipped["loss_model_dynamic"] > 0


@pytest.mark.parametrize("rollout", ROLLOUTS)
def test_slowreg_weighs_the_slow_critic_term_in_both_critic_losses(rollout, data):
    """loss_value = value x mean(discount x (critic + slowreg x slow)): linear in
    slowreg with slope value_slow_loss; the replay-value term is linear in it too."""
    runs = {weight: forward(data, rollout, f"learner.slowreg={weight}")[0] for weight in (0, 1, 2)}
    slope = runs[1]["value_slow_loss"]
    assert slope > 0
    for weight, entries in runs.items():
        torch.testing.assert_close(
            entries["loss_value"], runs[0]["loss_value"] + weight * slope, rtol=1e-5, atol=0
        )
        for key in entries:
            # value_slow_loss: the slow term itself, reported as 0 when its weight is
            if key not in ("loss_value", "loss_replay_value", "replay_value", "value_slow_loss"):
                assert torch.equal(entries[key], runs[1][key]), (weight, key)
    replay = [runs[w]["loss_replay_value"] for w in (0, 1, 2)]
    assert replay[1] > replay[0]
    torch.testing.assert_close(replay[2] - replay[1], replay[1] - replay[0], rtol=1e-4, atol=0)


def starts_of(rollout: str, module, loss) -> list:
    """Record the states imagination starts from."""
    seen = []
    if rollout == "ours":
        imagine = module._imagine

        def recording(state, belief, horizon):
            seen.append(state.clone())
            return imagine(state, belief, horizon)

        module._imagine = recording
    else:
        loss.actor_loss.register_forward_pre_hook(
            lambda _, args: seen.append(args[0].get("state").clone())
        )
    return seen


@pytest.mark.parametrize("rollout", ROLLOUTS)
def test_imag_last_imagines_from_the_last_steps_of_every_sequence(rollout, data):
    spaces, batch = data
    cfg = load([*BASE, "learner.imag_last=4"])
    torch.manual_seed(0)
    loss = build_agent(cfg.model, cfg.learner, spaces).loss
    module = loss if rollout == "ours" else TorchrlReference(loss)
    seen = starts_of(rollout, module, loss)
    with same_draws():
        out = module(prepared(module, loss, batch))
    states = out["replay_context"]["state"]  # the posterior states, [batch, length, ...]
    assert states.shape[:2] == (cfg.replay.batch, cfg.replay.length)
    (starts,) = seen
    torch.testing.assert_close(starts, states[:, -4:].reshape(-1, states.shape[-1]))
    # the replay-value term stays defined: on the same last steps
    assert torch.isfinite(out["loss_replay_value"]) and out["loss_replay_value"] > 0


@pytest.mark.parametrize("rollout", ROLLOUTS)
def test_imag_last_of_the_whole_sequence_is_every_step(rollout, data):
    length = load(BASE).replay.length
    every, _, _ = forward(data, rollout)
    last, _, _ = forward(data, rollout, f"learner.imag_last={length}")
    for key in every:
        assert torch.equal(every[key], last[key]), key


@pytest.mark.parametrize("rollout", ROLLOUTS)
def test_the_replay_value_learns_on_the_last_steps_only(rollout, data):
    """With imag_last=K the replay-value returns use the rewards of the last K steps
    alone; from every step (imag_last=0), every reward but the first."""
    spaces, batch = data
    length, last = batch.shape[-1], 4
    changed = batch.clone()
    reward = changed.get(("next", "reward"))
    changed.set(
        ("next", "reward"), torch.cat([reward[:, : length - last] + 1, reward[:, -last:]], 1)
    )
    for imag_last, moves in ((last, False), (0, True)):
        setting = f"learner.imag_last={imag_last}"
        before, _, _ = forward(data, rollout, setting, perturbed=True)
        after, _, _ = forward((spaces, changed), rollout, setting, perturbed=True)
        assert not torch.equal(before["loss_model_reward"], after["loss_model_reward"])
        same = torch.equal(before["loss_replay_value"], after["loss_replay_value"])
        assert same != moves, imag_last


@pytest.mark.parametrize("head_layers", [1, 2])
def test_head_layers_sets_the_reward_and_continue_depth_alone(data, head_layers):
    """``model.head_layers`` is the depth of the reward and continue heads (the official
    rewhead/conhead.layers); ``model.layers`` keeps the actor's and critic's."""
    spaces, _ = data
    cfg = load([*BASE, "model.layers=3", f"model.head_layers={head_layers}"])
    agent = build_agent(cfg.model, cfg.learner, spaces)

    def linears(module):
        return sum(isinstance(m, torch.nn.Linear) for m in module.modules())

    reward = agent.world_model[-2][0].module
    continue_ = agent.world_model[-1].module
    assert linears(reward) == linears(continue_) == head_layers + 1
    assert linears(agent.value) == cfg.model.layers + 1
