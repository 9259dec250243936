"""Wires torchrl's DreamerV3 components into one agent: world model, actor, critic,
the acting policy served to the collector, and the combined DreamerV3 loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
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

from dreamer.agent.acting import ActingPolicy
from dreamer.agent.loss import DreamerLoss, Networks
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

    def loss_names(self, part) -> dict[str, str]:
        """``part``'s state-dict names (the world model, actor, value or acting policy)
        -> the loss's names of the same tensors (the loss owns every parameter)."""
        name_of = {id(value): name for name, value in self.loss.state_dict(keep_vars=True).items()}
        return {
            name: name_of[id(value)]
            for name, value in part.state_dict(keep_vars=True).items()
            if id(value) in name_of
        }


def _build_head(
    in_features: int, out: int, model, depth: int, outscale: float = 1.0
) -> DreamerV3MLP:
    return DreamerV3MLP(in_features, out, depth=depth, num_cells=model.units, outscale=outscale)


def _two_hot_head(
    net: nn.Module, decode: SymExpTwoHot, prefix, name: str, in_keys
) -> TensorDictSequential:
    logits = (*prefix, f"{name}_logits") if prefix else f"{name}_logits"
    value = (*prefix, name) if prefix else name
    return TensorDictSequential(
        TensorDictModule(net, in_keys=in_keys, out_keys=[logits]),
        TensorDictModule(ToFloat(), in_keys=[logits], out_keys=[logits]),
        TensorDictModule(decode, in_keys=[logits], out_keys=[value]),
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
    """(stochastic state size, deterministic belief size): the latent acting carries."""
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
    return ActingPolicy(
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
    actor = make_actor(spaces, sum(latent_sizes(model)), model)
    return acting_policy(encoder, prior, posterior, actor, [key.name for key in spaces.obs])


def build_agent(model, learner, spaces: EnvSpaces) -> Agent:
    """Every network and the DreamerV3 loss from the ``model`` and ``learner`` config
    nodes, made in one fixed order (a seed gives the same weights)."""
    state_dim, deter = latent_sizes(model)
    features = state_dim + deter
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
    reward_net = _build_head(features, model.bins, model, model.head_layers, outscale=0.0)
    continue_net = _build_head(features, 1, model, model.head_layers)
    reward_decode = SymExpTwoHot(model.bins)
    world_model = _build_world_model(
        model, spaces, encoder, prior, posterior, decoder, reward_net, reward_decode, continue_net
    )
    imagination_env, continuation = _imagination(model, spaces, prior, reward_net, continue_net)
    actor = make_actor(spaces, features, model)
    value_net = _build_head(features, model.bins, model, model.layers, outscale=0.0)
    value_decode = SymExpTwoHot(model.bins)
    value = _two_hot_head(value_net, value_decode, (), "state_value", ["state", "belief"])
    networks = Networks(
        obs_keys=[("next", name) for name in obs_names],
        encoder=encoder,
        decoder=decoder,
        prior=prior,
        posterior=posterior,
        reward=reward_net,
        reward_decode=reward_decode,
        continues=continue_net,
        value=value_net,
        value_decode=value_decode,
        actor=actor,
    )
    loss = _loss(
        model, learner, spaces, world_model, actor, value, imagination_env, continuation, networks
    )
    target_updater = SoftUpdate(loss.value_loss, tau=learner.slow_critic_rate)
    policy = acting_policy(encoder, prior, posterior, actor, obs_names)
    return Agent(spaces, world_model, actor, value, policy, loss, target_updater)


def _build_world_model(
    model, spaces, encoder, prior, posterior, decoder, reward_net, reward_decode, continue_net
):
    """torchrl's world model on replayed sequences (RSSM rollout from zeros)."""
    obs_names = [key.name for key in spaces.obs]
    next_latent = [("next", "state"), ("next", "belief")]
    return TensorDictSequential(
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
        _two_hot_head(reward_net, reward_decode, ("next",), "reward", next_latent),
        TensorDictModule(continue_net, in_keys=next_latent, out_keys=[("next", "continue_pred")]),
    )


def _imagination(model, spaces: EnvSpaces, prior, reward_net, continue_net):
    """torchrl's imagination env and the continuation model the actor loss discounts with."""
    state_dim, _ = latent_sizes(model)
    imagination = WorldModelWrapper(
        TensorDictModule(
            prior, in_keys=["state", "belief", "action"], out_keys=["_", "state", "belief"]
        ),
        _two_hot_head(reward_net, SymExpTwoHot(model.bins), (), "reward", ["state", "belief"]),
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
    return imagination_env, continuation


def _loss(
    model, learner, spaces, world_model, actor, value, imagination_env, continuation, networks
):
    """torchrl's three DreamerV3 losses, unweighted, in ``DreamerLoss`` (which weighs them)."""
    obs_names = [key.name for key in spaces.obs]
    model_loss = DreamerV3ModelLoss(
        world_model,
        kl_mode="separate",
        lambda_reco=1.0,
        lambda_reward=1.0,
        lambda_dynamic=1.0,
        lambda_representation=1.0,
        lambda_continue=1.0,
        unimix=model.unimix,
        free_bits=learner.free_nats,  # torchrl's name; the KL is in nats
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
        # any weight > 0 makes the slow critic's modules; set below, slowreg=0 keeps them
        slow_critic_regularization=1.0,
    )
    value_loss.slow_critic_regularization = learner.slowreg
    return DreamerLoss(
        model_loss,
        actor_loss,
        value_loss,
        networks=networks,
        scales={name: float(value) for name, value in learner.loss_scales.items()},
        continuation_horizon=learner.return_horizon,  # torchrl's name: the discount's horizon
        lmbda=learner.lmbda,
        imag_last=learner.imag_last,
    )
