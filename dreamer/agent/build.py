"""Wires torchrl's DreamerV3 components into one agent: world model, actor, critic,
the acting policy served to the collector, and the combined DreamerV3 loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
from torch import nn
from torchrl.data import Bounded, Composite, MultiOneHot, OneHot, Unbounded
from torchrl.envs.model_based.dreamer import DreamerEnv
from torchrl.modules import (
    DreamerV3DiscreteActor,
    DreamerV3MLP,
    RSSMPosteriorV3,
    RSSMPriorV3,
    RSSMStateEstimatorV3,
    SymExpTwoHot,
    WorldModelWrapper,
)
from torchrl.modules.distributions.continuous import IndependentNormal
from torchrl.objectives import (
    DreamerV3ActorLoss,
    DreamerV3Loss,
    DreamerV3ModelLoss,
    DreamerV3ValueLoss,
    SoftUpdate,
    ValueEstimators,
)

from dreamer.agent.masked import masked_multi_head_actor
from dreamer.agent.networks import Carry, ContinuousActorNet, MultiDecoder, MultiEncoder, ToFloat
from dreamer.agent.rollout import ZeroStartRollout
from dreamer.agent.spaces import EnvSpaces


def reco_key(name: str) -> str:
    return f"reco_{name}"


@dataclass
class Agent:
    spaces: EnvSpaces
    world_model: TensorDictSequential
    actor: ProbabilisticTensorDictSequential
    value: TensorDictSequential
    policy: TensorDictSequential
    loss: DreamerV3Loss
    target_updater: SoftUpdate


def _head(in_features: int, out: int, model, depth: int, outscale: float = 1.0) -> DreamerV3MLP:
    return DreamerV3MLP(in_features, out, depth=depth, num_cells=model.units, outscale=outscale)


def _two_hot_head(net: nn.Module, prefix, name: str, in_keys, bins: int) -> TensorDictSequential:
    logits = (*prefix, f"{name}_logits") if prefix else f"{name}_logits"
    value = (*prefix, name) if prefix else name
    return TensorDictSequential(
        TensorDictModule(net, in_keys=in_keys, out_keys=[logits]),
        TensorDictModule(ToFloat(), in_keys=[logits], out_keys=[logits]),
        TensorDictModule(SymExpTwoHot(bins), in_keys=[logits], out_keys=[value]),
    )


def make_actor(spaces: EnvSpaces, features: int, model) -> ProbabilisticTensorDictSequential:
    if spaces.action_heads:
        return masked_multi_head_actor(
            features,
            spaces.action_heads,
            depth=model.layers,
            units=model.units,
            unimix=model.unimix,
        )
    if spaces.discrete:
        return DreamerV3DiscreteActor(
            features,
            spaces.action_dim,
            depth=model.layers,
            num_cells=model.units,
            unimix=model.unimix,
        )
    return ProbabilisticTensorDictSequential(
        TensorDictModule(
            ContinuousActorNet(features, spaces.action_dim, model.units, model.layers),
            in_keys=["state", "belief"],
            out_keys=["loc", "scale"],
        ),
        ProbabilisticTensorDictModule(
            in_keys=["loc", "scale"],
            out_keys=["action"],
            default_interaction_type=InteractionType.RANDOM,
            distribution_class=IndependentNormal,
            return_log_prob=True,
            log_prob_key="action_log_prob",
        ),
    )


def _action_spec(spaces: EnvSpaces):
    if spaces.action_heads:
        return MultiOneHot([head.size for head in spaces.action_heads])
    if spaces.discrete:
        return OneHot(spaces.action_dim)
    return Bounded(-1.0, 1.0, (spaces.action_dim,))  # make_env rescales to the env's bounds


def latent_sizes(model) -> tuple[int, int]:
    """(stochastic state size, deterministic belief size) of a ``model`` config node: the
    latent the acting policy carries from step to step."""
    return model.stoch * model.classes, model.deter


def build_rssm(model, spaces: EnvSpaces) -> tuple[MultiEncoder, RSSMPriorV3, RSSMPosteriorV3]:
    """The observation encoder and the RSSM cell (prior with its block GRU, posterior)."""
    encoder = MultiEncoder(
        spaces, model.cnn_depth, model.units, model.layers, strided=model.cnn_strided
    )
    prior = RSSMPriorV3(
        action_shape=(spaces.action_dim,),
        action_dim=spaces.action_dim,
        hidden_dim=model.hidden,
        rnn_hidden_dim=model.deter,
        num_categoricals=model.stoch,
        num_classes=model.classes,
        recurrent_model="block_gru",
        num_blocks=model.blocks,
        unimix=model.unimix,
    )
    posterior = RSSMPosteriorV3(
        hidden_dim=model.hidden,
        num_categoricals=model.stoch,
        num_classes=model.classes,
        rnn_hidden_dim=model.deter,
        obs_embed_dim=encoder.out_features,
        use_rms_norm=True,
        unimix=model.unimix,
    )
    return encoder, prior, posterior


def acting_policy(
    encoder: MultiEncoder,
    prior: RSSMPriorV3,
    posterior: RSSMPosteriorV3,
    actor: ProbabilisticTensorDictSequential,
    obs_names: list[str],
) -> TensorDictSequential:
    """Observation -> posterior latent -> action, with the latent carried in ``next``."""
    return TensorDictSequential(
        TensorDictModule(encoder, in_keys=obs_names, out_keys=["encoded_latents"]),
        RSSMStateEstimatorV3(prior, posterior),
        actor,
        TensorDictModule(
            Carry(),
            in_keys=["state", "belief", "action"],
            out_keys=[("next", "state"), ("next", "belief"), ("next", "previous_action")],
        ),
        selected_out_keys=[
            "action",
            "state",
            "belief",
            ("next", "state"),
            ("next", "belief"),
            ("next", "previous_action"),
        ],
    )


def build_acting(model, spaces: EnvSpaces) -> TensorDictSequential:
    """Only what acting needs (encoder, RSSM cell, actor): no decoder, heads or loss."""
    encoder, prior, posterior = build_rssm(model, spaces)
    state_dim, _ = latent_sizes(model)
    actor = make_actor(spaces, state_dim + model.deter, model)
    return acting_policy(encoder, prior, posterior, actor, [key.name for key in spaces.obs])


def build_agent(model, learner, spaces: EnvSpaces) -> Agent:
    """Build every network and the DreamerV3 loss from the ``model`` and ``learner``
    config nodes (attribute access: deter, hidden, stoch, classes, ...). Data-parallel
    ranks build the same loss: each imagines from the last ``learner.imag_last`` steps
    of its own sequences."""
    state_dim, _ = latent_sizes(model)
    features = state_dim + model.deter
    obs_names = [key.name for key in spaces.obs]

    encoder, prior, posterior = build_rssm(model, spaces)
    decoder = MultiDecoder(
        spaces,
        features,
        model.cnn_depth,
        model.units,
        model.layers,
        strided=model.cnn_strided,
        state_features=state_dim,
    )
    reward_net = _head(features, model.bins, model, model.head_layers, outscale=0.0)
    continue_net = _head(features, 1, model, model.head_layers)
    next_latent = [("next", "state"), ("next", "belief")]

    world_model = TensorDictSequential(
        TensorDictModule(
            encoder,
            in_keys=[("next", name) for name in obs_names],
            out_keys=[("next", "encoded_latents")],
        ),
        ZeroStartRollout(
            TensorDictModule(
                prior,
                in_keys=["state", "belief", "action"],
                out_keys=[("next", "prior_logits"), ("next", "state"), ("next", "belief")],
            ),
            TensorDictModule(
                posterior,
                in_keys=[("next", "belief"), ("next", "encoded_latents")],
                out_keys=[("next", "posterior_logits"), ("next", "state")],
            ),
            reset_key="is_init",
        ),
        TensorDictModule(
            decoder,
            in_keys=next_latent,
            out_keys=[("next", reco_key(name)) for name in obs_names],
        ),
        _two_hot_head(reward_net, ("next",), "reward", next_latent, model.bins),
        TensorDictModule(continue_net, in_keys=next_latent, out_keys=[("next", "continue_pred")]),
    )

    imagination = WorldModelWrapper(
        TensorDictModule(
            prior, in_keys=["state", "belief", "action"], out_keys=["_", "state", "belief"]
        ),
        _two_hot_head(reward_net, (), "reward", ["state", "belief"], model.bins),
    )
    imagination_env = DreamerEnv(
        imagination, prior_shape=torch.Size([state_dim]), belief_shape=torch.Size([model.deter])
    )
    imagination_env.observation_spec = Composite(
        state=Unbounded(state_dim), belief=Unbounded(model.deter)
    )
    imagination_env.state_spec = imagination_env.observation_spec.clone()
    imagination_env.action_spec = _action_spec(spaces)
    imagination_env.reward_spec = Unbounded((1,))
    continuation = TensorDictSequential(
        TensorDictModule(continue_net, in_keys=["state", "belief"], out_keys=["continue_logits"]),
        TensorDictModule(nn.Sigmoid(), in_keys=["continue_logits"], out_keys=["continuation"]),
    )

    actor = make_actor(spaces, features, model)
    value = _two_hot_head(
        _head(features, model.bins, model, model.layers, outscale=0.0),
        (),
        "state_value",
        ["state", "belief"],
        model.bins,
    )

    scales = learner.loss_scales
    model_loss = DreamerV3ModelLoss(
        world_model,
        kl_mode="separate",
        lambda_reco=scales.rec,
        lambda_reward=scales.rew,
        lambda_dynamic=scales.dyn,
        lambda_representation=scales.rep,
        lambda_continue=scales.con,
        unimix=model.unimix,
        free_bits=learner.free_nats,
        reco_symlog=[key.kind == "vector" for key in spaces.obs],
        num_reward_bins=model.bins,
        detach_output=False,
    )
    model_loss.set_keys(pixels=obs_names, reco_pixels=[reco_key(n) for n in obs_names])
    actor_loss = DreamerV3ActorLoss(
        actor,
        value,
        imagination_env,
        continuation_model=continuation,
        imagination_horizon=learner.horizon,
        entropy_bonus=learner.entropy,
        use_reinforce=True,
    )
    actor_loss.make_value_estimator(
        ValueEstimators.TDLambda, gamma=1 - 1 / learner.return_horizon, lmbda=learner.lmbda
    )
    value_loss = DreamerV3ValueLoss(
        value,
        value_loss="two_hot",
        actor_loss=actor_loss,
        num_value_bins=model.bins,
        # any weight > 0 creates the slow critic's parameters (checkpointed, tracked by
        # SoftUpdate); the weight itself is set below, so slowreg=0 keeps the same modules
        slow_critic_regularization=1.0,
    )
    value_loss.slow_critic_regularization = learner.slowreg
    loss = DreamerLoss(
        model_loss,
        actor_loss,
        value_loss,
        replay_value_loss_weight=scales.repval,
        continuation_horizon=learner.return_horizon,
        lmbda=learner.lmbda,
        policy_scale=scales.policy,
        value_scale=scales.value,
        imag_last=learner.imag_last,
    )
    target_updater = SoftUpdate(value_loss, tau=learner.slow_critic)

    policy = acting_policy(encoder, prior, posterior, actor, obs_names)
    return Agent(spaces, world_model, actor, value, policy, loss, target_updater)


class DreamerLoss(DreamerV3Loss):
    """torchrl's ``DreamerV3Loss`` with what it has no knob for, as the official agent:

    - ``policy_scale`` and ``value_scale`` (``learner.loss_scales.policy`` / ``value``):
      torchrl weighs every other term itself (``lambda_*`` of the model loss,
      ``replay_value_loss_weight``) but returns ``loss_actor`` and ``loss_value``
      unweighted; they are scaled here, in the entries the stepper sums;
    - ``imag_last`` (``learner.imag_last``): imagination starts from the last K
      replayed steps of every sequence (0: all of them), and the replay-value term
      learns on those K steps, bootstrapped from their imagined returns.

    The forward is torchrl's, with those two changes.
    """

    def __init__(
        self,
        *args,
        policy_scale: float = 1.0,
        value_scale: float = 1.0,
        imag_last: int = 0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.policy_scale = policy_scale
        self.value_scale = value_scale
        self.imag_last = imag_last

    def forward(self, sample: TensorDictBase) -> TensorDictBase:
        keys = self.tensor_keys
        model_losses, posterior = self.model_loss(sample)
        replayed = posterior.get("next")
        last = imagined_steps(self.imag_last, sample.shape[-1])
        starts = replayed if last is None else replayed[..., -last:]
        state, belief = starts.get(keys.state).detach(), starts.get(keys.belief).detach()
        actor_keys = self.actor_loss.tensor_keys
        actor_input = TensorDict(
            {
                actor_keys.state: state.reshape(-1, state.shape[-1]),
                actor_keys.belief: belief.reshape(-1, belief.shape[-1]),
            },
            [starts.numel()],
        )
        actor_losses, imagined = self.actor_loss(actor_input)
        value_losses, _ = self.value_loss(imagined.detach())
        if self.replay_value_loss_weight:
            value_keys = self.value_loss.tensor_keys
            replay_features = starts.select(*self.value_loss.value_model.in_keys)
            replay_features.set(
                value_keys.bootstrap,
                imagined.get("lambda_target")[..., 0, 0].reshape(starts.shape),
            )
            targets = sample.get("next").select(
                value_keys.reward, value_keys.done, value_keys.terminated
            )
            replay_features.set("next", targets if last is None else targets[..., -last:])
            replay_value = self.value_loss.replay_value_loss(
                replay_features, horizon=self.continuation_horizon, lmbda=self.lmbda
            )["loss_replay_value"]
        else:
            replay_value = state.new_zeros(())
        result = model_losses.apply(torch.squeeze)
        result.update(actor_losses).update(value_losses)
        # torchrl's actor and value losses have no weight of their own: scaled here
        result.set("loss_actor", self.policy_scale * result.get("loss_actor"))
        result.set("loss_value", self.value_scale * result.get("loss_value"))
        result.set("loss_replay_value", self.replay_value_loss_weight * replay_value)
        result.set("replay_value", replay_value.detach())
        result.set(
            keys.replay_context,
            replayed.select(keys.state, keys.belief).detach(),
        )
        return result


def imagined_steps(imag_last: int, length: int) -> int | None:
    """How many of a sequence's last steps imagination starts from; None: all of them
    (``learner.imag_last`` 0, or not less than the sequence)."""
    return imag_last if 0 < imag_last < length else None
