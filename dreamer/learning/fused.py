"""DreamerV3's loss with the sequential parts run as plain-tensor scans.

torchrl's ``DreamerV3Loss`` is the source of truth: its networks own every parameter
and buffer (checkpoints are unchanged) and this module computes the same losses, with
the same random draws in the same order. What differs is how:

- the 64-step posterior rollout is one RSSM cell applied per step on tensors; the
  parts that do not depend on the recurrence (action projection, the observation
  half of the posterior's first layer, the prior head, decoder, reward and continue
  heads) run once over all B x T steps;
- the block GRU's first layer multiplies the shared (belief, state, action) features
  once instead of once per block on a repeated copy (same weights, same sum);
- imagination runs under ``no_grad`` (torchrl holds the world model out and detaches
  every imagined quantity before a loss uses it, so no gradient can flow there), with
  no TensorDict, environment or ``step_mdp`` per step; reward, value and continue
  heads run once over all imagined steps.

torchrl 0.14.1 already takes its tensor fast path for our RSSM wiring
(``RSSMRolloutV3._check_fast_path`` is true), but its imagination steps a
``DreamerEnv`` with a TensorDict policy per step, builds the autograd graph through
it, and calls each head per step.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torch.nn import functional
from torchrl.modules import DreamerV3MLP
from torchrl.modules.distributions.utils import has_analytic_entropy, rsample_and_log_prob
from torchrl.objectives.dreamer_v3 import categorical_kl_terms, symlog

from dreamer.agent.loss import dreamer_v3_loss, finite_starts, imagined_steps
from dreamer.torchrl_compat import (
    BlockLinear,
    RMSNorm,
    dist_sample,
    match_trailing_dim,
    reduce_loss,
    replay_value_target,
    return_scale,
    straight_through_categorical,
)


def two_hot_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, bins: torch.Tensor
) -> torch.Tensor:
    """torchrl's ``two_hot_cross_entropy`` without its dense two-hot target: the
    log-probabilities of the two bins around each target, weighted; the same values and
    gradients (tests/test_fused.py). Compiled, torchrl's form found each target's bin
    again for every one of the 255 bins it scattered into: one kernel of 37 ms in a
    0.65 s update (15,360 imagined targets, one AMD EPYC thread), 13 ms here; the update
    1.5-3% faster (benchmarks/README.md, "Where ours' update goes")."""
    if target.shape == (*logits.shape[:-1], 1):
        target = target.squeeze(-1)
    bins = bins.to(device=target.device, dtype=target.dtype)
    target = target.clamp(bins[0], bins[-1])
    lower = ((target.unsqueeze(-1) >= bins).sum(-1) - 1).clamp(0, bins.numel() - 2)
    upper = lower + 1
    lower_value = bins[lower]
    upper_weight = (target - lower_value) / (bins[upper] - lower_value)
    around = torch.log_softmax(logits, dim=-1).gather(-1, torch.stack((lower, upper), -1))
    return -((1 - upper_weight) * around[..., 0] + upper_weight * around[..., 1])


def _rms(value: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    weight = norm.weight
    return functional.rms_norm(value.float(), (weight.shape[0],), weight.float(), norm.eps).to(
        value.dtype
    )


def _block_linear(value: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    blocks, _, block_out = weight.shape
    batch = value.shape[:-1]
    value = value.reshape(-1, blocks, value.shape[-1] // blocks).transpose(0, 1)
    value = torch.bmm(value, weight.to(value.dtype)).transpose(0, 1)
    value = value.reshape(*batch, blocks * block_out)
    return value if bias is None else value + bias.to(value.dtype)


# MKL's fp32 product is slow on an output width that is not a multiple of 16: the
# two-hot heads' last layer (64 -> 255 bins) over 15,360 imagined states took 14.8 ms
# against 6.5 ms for 64 -> 256 (one AMD EPYC thread; 5.1 / 3.3 ms at two). Such a layer
# multiplies weights padded with zero rows and slices the padding off its output: each
# output is its own row's dot product, the same values (tests/test_fused.py).
PAD_OUTPUTS = 16
PADDED_FROM = 128  # narrower layers (the actor's means and scales) are left as they are


def _linear(value: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    width = layer.out_features
    pad = -width % PAD_OUTPUTS
    if pad == 0 or width < PADDED_FROM:
        return functional.linear(value, layer.weight, layer.bias)
    weight = functional.pad(layer.weight, (0, 0, 0, pad))
    bias = None if layer.bias is None else functional.pad(layer.bias, (0, pad))
    return functional.linear(value, weight, bias)[..., :width]


def _run(layers: nn.Sequential, value: torch.Tensor) -> torch.Tensor:
    """A torchrl Sequential of Linear / RMSNorm / SiLU / block-linear layers, without
    the per-module call overhead."""
    for layer in layers:
        if type(layer) is nn.Linear:
            value = _linear(value, layer)
        elif type(layer) is RMSNorm:
            value = _rms(value, layer)
        elif type(layer) is nn.SiLU:
            value = functional.silu(value)
        elif type(layer) is BlockLinear:
            value = _block_linear(value, layer.weight, layer.bias)
        else:
            value = layer(value)
    return value


class RSSMCell:
    """torchrl's ``RSSMPriorV3`` (block GRU) and ``RSSMPosteriorV3`` as tensor functions.

    Reads the modules' parameters at each call, so optimizer steps and
    ``load_state_dict`` are seen; owns nothing.
    """

    def __init__(self, prior: nn.Module, posterior: nn.Module):
        if prior.recurrent_model != "block_gru":
            raise ValueError("the fused rollout needs the block-GRU RSSM")
        rnn = prior.rnn
        first = rnn.hidden_layers[0]
        if not isinstance(first, BlockLinear) or len(rnn.hidden_layers) != 3:
            raise ValueError("the fused rollout needs one block-linear GRU layer")
        self.prior, self.posterior, self.rnn = prior, posterior, rnn
        self.blocks = rnn.num_blocks
        self.deter = rnn.belief_dim
        self.hidden = rnn.belief_projection[0].out_features
        self.stoch = prior.num_categoricals * prior.num_classes

    # -- pieces of the block GRU's first layer -----------------------------------
    def _split_first_layer(self):
        """The first block-linear layer as (belief weights per block, dense weights of
        the belief, state and action projections, bias): each block sees its belief
        slice and the same features, so the feature part is one dense product."""
        layer = self.rnn.hidden_layers[0]
        weight = layer.weight  # [blocks, belief/blocks + 3 * hidden, out/blocks]
        per_block = self.deter // self.blocks
        on_belief = weight[:, :per_block].contiguous()
        features = weight[:, per_block:].permute(1, 0, 2).reshape(3 * self.hidden, -1)
        h = self.hidden
        return on_belief, features[:h], features[h : 2 * h], features[2 * h :], layer.bias

    def action_term(self, action: torch.Tensor, split) -> torch.Tensor:
        """The action's contribution to the GRU's first layer, bias included; it does
        not depend on the recurrence, so the posterior rollout computes it for all
        steps at once."""
        action = action / action.detach().abs().clamp_min(1)
        projected = _run(self.rnn.action_projection, action)
        return projected @ split[3] + split[4]

    def belief_step(self, state, belief, action_term, split) -> torch.Tensor:
        """The block GRU: the new belief from the previous state and belief."""
        on_belief, from_belief, from_state = split[0], split[1], split[2]
        rnn = self.rnn
        hidden = (
            _block_linear(belief, on_belief, None)
            + _run(rnn.belief_projection, belief) @ from_belief
            + _run(rnn.state_projection, state) @ from_state
            + action_term
        )
        hidden = functional.silu(_rms(hidden, rnn.hidden_layers[1]))
        gates = _block_linear(hidden, rnn.gates.weight, rnn.gates.bias)
        gates = gates.reshape(*hidden.shape[:-1], self.blocks, 3, self.deter // self.blocks)
        reset, candidate, update = gates.unbind(-2)
        reset = reset.flatten(-2).sigmoid()
        candidate = (reset * candidate.flatten(-2)).tanh()
        update = (update.flatten(-2) - 1.0).sigmoid()
        return update * candidate + (1 - update) * belief

    def logits(self, layers: nn.Sequential, value: torch.Tensor) -> torch.Tensor:
        out = _run(layers, value)
        return out.view(*out.shape[:-1], self.prior.num_categoricals, self.prior.num_classes)

    def prior_logits(self, belief: torch.Tensor) -> torch.Tensor:
        return self.logits(self.prior.rnn_to_prior_projector, belief)

    def sample(self, logits: torch.Tensor, unimix: float, uniform=None) -> torch.Tensor:
        state = straight_through_categorical(logits, unimix, uniform=uniform)
        return state.view(*state.shape[:-2], self.stoch)

    def observe(self, state, belief, action, embedding, reset):
        """The posterior rollout over [B, T]: (posterior states, beliefs, posterior
        logits), each [B, T, ...]; zeroes state, belief and action where ``reset``."""
        if not action.is_floating_point():
            action = action.to(belief.dtype)
        length = action.shape[-2]
        # torchrl's rollout draws one uniform per categorical, for the prior (unused)
        # and the posterior, in one call: the same call keeps the random stream.
        uniforms = torch.rand(
            length, 2, *action.shape[:-2], self.prior.num_categoricals, device=action.device
        )
        split = self._split_first_layer()
        action = torch.where(reset, 0, action)
        action_terms = self.action_term(action, split)
        first = self.posterior.obs_rnn_to_post_projector[0]
        # the embedding half of the posterior's first layer, for every step at once
        from_embedding = functional.linear(embedding, first.weight[:, self.deter :], first.bias)
        states, beliefs, logits = [], [], []
        for t in range(length):
            state, belief, posterior_logits = self.posterior_step(
                state,
                belief,
                reset[..., t, :],
                action_terms[..., t, :],
                from_embedding[..., t, :],
                uniforms[t, 1],
                split,
            )
            states.append(state)
            beliefs.append(belief)
            logits.append(posterior_logits)
        return torch.stack(states, -2), torch.stack(beliefs, -2), torch.stack(logits, -3)

    def posterior_step(self, state, belief, reset, action_term, from_embedding, uniform, split):
        """One posterior step on tensors: (state, belief, posterior logits)."""
        state = torch.where(reset, 0, state)
        belief = torch.where(reset, 0, belief)
        belief = self.belief_step(state, belief, action_term, split)
        layers = self.posterior.obs_rnn_to_post_projector
        hidden = functional.linear(belief, layers[0].weight[:, : self.deter]) + from_embedding
        logits = self.logits(layers[1:], hidden)
        return self.sample(logits, self.posterior.unimix, uniform), belief, logits

    def imagine_step(self, state, belief, action, split) -> tuple[torch.Tensor, torch.Tensor]:
        """One prior step (the imagination env's step): next state and belief."""
        # the draw straight_through_categorical would make, made here: a compiled
        # prior step then consumes torch's random stream as the eager one does
        uniform = torch.rand(*state.shape[:-1], self.prior.num_categoricals, device=state.device)
        return self.prior_step(state, belief, action, uniform, split)

    def prior_step(self, state, belief, action, uniform, split):
        if not action.is_floating_point():
            action = action.to(belief.dtype)
        belief = self.belief_step(state, belief, self.action_term(action, split), split)
        return self.sample(self.prior_logits(belief), self.prior.unimix, uniform), belief

    def compile(self) -> None:
        """Compile the two per-step functions (small graphs, one per shape) that the
        rollouts call 64 and 15 times per update."""
        self.posterior_step = torch.compile(self.posterior_step, dynamic=False)
        self.prior_step = torch.compile(self.prior_step, dynamic=False)


class ActorParts:
    """A torchrl actor (``ProbabilisticTensorDictSequential``: network, then the
    distribution module) called on tensors: any distribution, any sampler."""

    def __init__(self, actor):
        self.net_module = actor.module[0]
        self.net = self.net_module.module
        self.out_keys = list(self.net_module.out_keys)
        self.dist_module = actor.module[-1]

    def dist(self, state: torch.Tensor, belief: torch.Tensor):
        out = self.net(state, belief)
        out = dict(zip(self.out_keys, out if isinstance(out, tuple) else (out,)))
        module = self.dist_module
        kwargs = {}
        for dist_key, td_key in zip(module.dist_keys, module.in_keys):
            # absent entries (action masks: imagined states have none) are None,
            # which the distribution reads as "every choice valid", as torchrl's get_dist
            kwargs[dist_key[-1] if isinstance(dist_key, tuple) else dist_key] = out.get(td_key)
        return module.distribution_class(**kwargs, **dict(module.distribution_kwargs))

    def sample(self, dist) -> torch.Tensor:
        return dist_sample(self.dist_module, dist)


def _net(module):
    """The plain network inside a TensorDictModule."""
    return module.module


def _head(net: nn.Module, state, belief, features=None) -> torch.Tensor:
    """A (state, belief) head; a ``DreamerV3MLP`` takes ``features`` (the two already
    concatenated, shared by every head) instead of concatenating them again."""
    if features is not None and type(net) is DreamerV3MLP:
        return _run(net.model, features)
    return net(state, belief)


class FusedDreamerV3Loss(nn.Module):
    """Drop-in for torchrl's stepper: ``forward(sample)`` returns what
    ``DreamerV3Loss.forward`` returns, computed as described in the module docstring.

    The wrapped loss is a submodule, so parameters and buffers are its own; other
    attributes (``in_keys``, ``tensor_keys``, ``value_loss`` ...) are read through.
    """

    def __init__(self, loss: nn.Module):
        super().__init__()
        self.inner = loss
        model_loss, value_loss = loss.model_loss, loss.value_loss
        actor_loss = loss.actor_loss
        if model_loss.kl_mode != "separate" or not actor_loss.use_reinforce:
            raise ValueError("the fused loss computes separate KL terms and REINFORCE")
        if value_loss.value_loss != "two_hot" or model_loss.reco_loss != "l2":
            raise ValueError("the fused loss computes two-hot values and l2 reconstruction")
        wm = model_loss.world_model.module
        encoder, rollout, decoder, reward, cont = wm
        self.obs_keys = list(encoder.in_keys)
        self.action_key = rollout.action_key
        self.cell = RSSMCell(_net(rollout.rssm_prior), _net(rollout.rssm_posterior))
        self.encoder, self.decoder = _net(encoder), _net(decoder)
        self.reward_net, self.reward_decode = _net(reward.module[0]), _net(reward.module[2])
        self.continue_net = _net(cont)
        value_model = value_loss.value_model
        self.value_net, self.value_decode = _net(value_model.module[0]), _net(value_model.module[2])
        self.actor = ActorParts(actor_loss.actor_model)
        self.__dict__["actor_loss"] = actor_loss  # not a second owner of its parameters

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def _reconstruction(self, observations, states, beliefs) -> torch.Tensor:
        """The decoder's l2 loss summed over observation keys, as torchrl's model loss."""
        model_loss = self.inner.model_loss
        predictions = self.decoder(states, beliefs)
        if isinstance(predictions, torch.Tensor):
            predictions = (predictions,)
        use_symlog = model_loss.reco_symlog
        if isinstance(use_symlog, bool):
            use_symlog = [use_symlog] * len(predictions)
        reconstruction = 0
        for observation, prediction, transform in zip(
            observations, predictions, use_symlog, strict=True
        ):
            target = observation.contiguous()
            prediction = prediction.contiguous()
            if transform:
                target, prediction = symlog(target), symlog(prediction)
            else:
                if not target.is_floating_point():
                    target = target.float() / 255.0
                prediction = prediction.float()
            error = (target - prediction).pow(2).reshape(*states.shape[:-1], -1).sum(-1)
            reconstruction = reconstruction + error.mean()
        return reconstruction

    def compile(self) -> None:
        """torch.compile the rollouts' step functions: small graphs, compiled once per
        shape, that fuse the elementwise chains of the 64 + 15 steps. The batched parts
        (encoder, decoder, reconstruction) stay eager: compiling them gained little and
        doubled the cold compile (benchmarks/README.md, "Learner modes"). Everything after
        imagination (``_behavior``) is one loop-free graph over all imagined states:
        compiled, it fuses the heads' and the losses' elementwise work, 16% of an update
        (``benchmarks/profile_update.py``). It draws nothing at random: the actors'
        distributions here (IndependentNormal, MaskedMultiHead) have analytic entropies."""
        self.cell.compile()
        self._behavior = torch.compile(self._behavior, dynamic=False)

    # -- world model -------------------------------------------------------------
    def _world_model(self, sample: TensorDictBase):
        model_loss = self.inner.model_loss
        batch = sample.batch_size
        observations = [sample.get(key) for key in self.obs_keys]
        embedding = self.encoder(*observations)
        reset = sample.get("is_init", None)
        action = sample.get(self.action_key)
        if reset is None:
            reset = torch.zeros(*batch, 1, dtype=torch.bool, device=action.device)
        # every window starts from the zero latent, as ZeroStartRollout (rollout.py)
        start = batch[:-1]
        states, beliefs, posterior_logits = self.cell.observe(
            torch.zeros(*start, self.cell.stoch, device=action.device),
            torch.zeros(*start, self.cell.deter, device=action.device),
            action,
            embedding,
            reset.reshape(*batch, 1),
        )
        prior_logits = self.cell.prior_logits(beliefs)
        dynamic, representation = categorical_kl_terms(
            posterior_logits, prior_logits, free_nats=model_loss.free_bits, unimix=model_loss.unimix
        )
        reconstruction = self._reconstruction(observations, states, beliefs)
        next_td = sample.get("next")
        features = torch.cat([states, beliefs], -1)
        reward_logits = _head(self.reward_net, states, beliefs, features).float()
        reward_loss = two_hot_cross_entropy(
            reward_logits, next_td.get("reward"), model_loss.reward_bins
        ).mean()
        terminated = next_td.get("terminated", None)
        if terminated is None:
            terminated = next_td.get("done")
        target = (~terminated).float() * model_loss.continue_target_scale
        continue_loss = functional.binary_cross_entropy_with_logits(
            _head(self.continue_net, states, beliefs, features).squeeze(-1),
            target.squeeze(-1),
        )
        terms = {
            "rec": reconstruction,
            "rew": reward_loss,
            "con": continue_loss,
            "dyn": dynamic,
            "rep": representation,
        }
        return terms, states, beliefs, features

    # -- imagination ---------------------------------------------------------------
    @torch.no_grad()
    def _imagine(self, state: torch.Tensor, belief: torch.Tensor, horizon: int):
        """[N, H+1, state + belief] imagined features (the start included), written in
        place step by step, and [N, H] actions."""
        split = self.cell._split_first_layer()
        size = state.shape[-1]
        features = state.new_empty(state.shape[0], horizon + 1, size + belief.shape[-1])
        features[:, 0, :size], features[:, 0, size:] = state, belief
        actions = []
        for t in range(horizon):
            action = self.actor.sample(self.actor.dist(state, belief))
            state, belief = self.cell.imagine_step(state, belief, action, split)
            features[:, t + 1, :size], features[:, t + 1, size:] = state, belief
            actions.append(action)
        return features, torch.stack(actions, 1)

    def _value(self, state, belief, features=None) -> torch.Tensor:
        return self.value_decode(_head(self.value_net, state, belief, features).float())

    def _slow_value(self, state, belief, features=None) -> torch.Tensor:
        # not tensordict's ``with params.to_module(...)``: after an exception its exit
        # leaves the slow weights in the critic as plain tensors, its Parameters gone
        # (the final checkpoint would save that), and it turns Ctrl-C into a RuntimeError
        # (it returns a TensorDict, whose truth value raises)
        value_loss = self.inner.value_loss
        critic = value_loss.value_model
        fast = value_loss.target_value_model_params.to_module(critic, preserve_module_state=False)
        try:
            with torch.no_grad():
                return self._value(state, belief, features)
        finally:
            fast.to_module(critic, return_swap=False, preserve_module_state=False)

    def _returns(self, im_states, im_beliefs, features, horizon: int):
        """The critic's logits on every imagined state (with gradients for its loss on
        states 0..H-1; detached for the bootstrap values and the baseline), and the
        actor's targets: lambda returns, baseline, discount and continuation."""
        actor_loss = self.actor_loss
        value_logits_all = _head(self.value_net, im_states, im_beliefs, features).float()
        with torch.no_grad():
            next_s, next_b = im_states[:, 1:], im_beliefs[:, 1:]
            reward_logits = _head(self.reward_net, next_s, next_b, features[:, 1:]).float()
            reward = self.reward_decode(reward_logits)
            values = self.value_decode(value_logits_all.detach())
            next_value, baseline = values[:, 1:], values[:, :horizon]
            continues = torch.sigmoid(_head(self.continue_net, im_states, im_beliefs, features))
            continuation, root = continues[:, 1:], continues[:, :horizon]
            lambda_target = actor_loss.lambda_target(reward, next_value, continuation)
            if actor_loss.discount_loss:
                gamma = actor_loss.value_estimator.gamma.to(lambda_target.device)
                discount = torch.cat([root[:, :1], gamma * root[:, 1:]], 1).cumprod(1)
            else:
                discount = torch.ones_like(lambda_target)
        return value_logits_all, lambda_target, baseline, discount, continuation

    def forward(self, sample: TensorDictBase) -> TensorDictBase:
        loss = self.inner
        terms, states, beliefs, wm_features = self._world_model(sample)
        batch = sample.batch_size

        # learner.imag_last: imagine from the last K steps of every sequence (None: all)
        last = imagined_steps(loss.imag_last, batch[-1])
        start_state, start_belief = finite_starts(states, beliefs)
        if last is not None:
            start_state, start_belief = start_state[..., -last:, :], start_belief[..., -last:, :]
        start_state = start_state.reshape(-1, states.shape[-1])
        start_belief = start_belief.reshape(-1, beliefs.shape[-1])
        features, actions = self._imagine(
            start_state, start_belief, self.actor_loss.imagination_horizon
        )
        next_td = sample.get("next")
        result = self._behavior(
            terms,
            states,
            beliefs,
            wm_features,
            features,
            actions,
            next_td.get("reward"),
            next_td.get("done"),
            next_td.get("terminated", None),
            last,
        )
        out = TensorDict(result, [])
        out.set(
            loss.tensor_keys.replay_context,
            TensorDict({"state": states.detach(), "belief": beliefs.detach()}, batch),
        )
        return out

    def _behavior(
        self, terms, states, beliefs, wm_features, features, actions, reward, done, terminated, last
    ) -> dict[str, torch.Tensor]:
        """Everything after imagination: the heads on the imagined states, the actor's
        and the critic's losses, the replay-value loss, and the weighted sum of all
        terms: one graph for ``compile``."""
        loss = self.inner
        actor_loss, value_loss = self.actor_loss, loss.value_loss
        horizon = actions.shape[1]
        size = states.shape[-1]
        im_states, im_beliefs = features[..., :size], features[..., size:]
        now_s, now_b, now_f = im_states[:, :horizon], im_beliefs[:, :horizon], features[:, :horizon]
        value_logits_all, lambda_target, baseline, discount, continuation = self._returns(
            im_states, im_beliefs, features, horizon
        )
        # actor: REINFORCE on stopped imagined states and actions, as torchrl's
        dist = self.actor.dist(now_s, now_b)
        log_prob = match_trailing_dim(dist.log_prob(actions), lambda_target)
        scale = return_scale(actor_loss, lambda_target)
        advantage = (lambda_target - baseline) / scale
        actor_value = -(discount * log_prob * advantage).mean()
        if actor_loss.entropy_bonus > 0:
            if has_analytic_entropy(dist):
                entropy = dist.entropy()
            else:
                _, entropy_log_prob = rsample_and_log_prob(dist)
                entropy = -entropy_log_prob
            entropy = (discount * match_trailing_dim(entropy, discount)).mean()
            actor_value = actor_value - actor_loss.entropy_bonus * entropy
        else:
            entropy = actor_value.new_zeros(())

        # critic on the imagined states
        value_logits = value_logits_all[:, :horizon]
        target = lambda_target.squeeze(-1)
        step_discount = discount.squeeze(-1)
        regularize = value_loss.slow_critic_regularization
        critic = two_hot_cross_entropy(value_logits, target, value_loss.value_bins)
        if regularize:
            slow = self._slow_value(now_s, now_b, now_f).squeeze(-1)
            slow_loss = two_hot_cross_entropy(value_logits, slow, value_loss.value_bins)
            critic = critic + regularize * slow_loss
        else:
            slow_loss = torch.zeros_like(critic)

        replay_value = self._replay_value(
            reward, done, terminated, states, beliefs, wm_features, lambda_target, last
        )
        terms = {key: value.squeeze() for key, value in terms.items()}
        terms["policy"] = actor_value
        terms["value"] = reduce_loss(value_loss, step_discount * critic)
        terms["repval"] = replay_value
        result = dreamer_v3_loss(terms, loss.scales)
        result.update(
            actor_entropy=entropy.detach(),
            return_low=actor_loss.return_low.detach().clone(),
            return_high=actor_loss.return_high.detach().clone(),
            return_scale=scale.detach().clone(),
            continuation_mean=continuation.mean(),
            value_slow_loss=reduce_loss(value_loss, step_discount * slow_loss).detach(),
        )
        result["replay_value"] = replay_value.detach()
        return result

    def _replay_value(
        self, reward, done, terminated, states, beliefs, features, lambda_target, last
    ) -> torch.Tensor:
        """torchrl's replay-value term: the critic on the posterior states (gradients
        reach the world model), bootstrapped from each state's first imagined return;
        on the ``last`` steps of every sequence that imagination started from (None: all)."""
        loss, value_loss = self.inner, self.inner.value_loss
        if not loss.replay_value_loss_weight:
            return states.new_zeros(())
        if last is not None:
            reward, done = reward[..., -last:, :], done[..., -last:, :]
            terminated = None if terminated is None else terminated[..., -last:, :]
            states, beliefs = states[..., -last:, :], beliefs[..., -last:, :]
            features = features[..., -last:, :]
        target = replay_value_target(
            reward,
            done,
            terminated,
            lambda_target[..., 0, 0].reshape(done.shape[:-1]),
            loss.continuation_horizon,
            loss.lmbda,
        )
        weight = ~done.squeeze(-1)[..., :-1]
        prediction = _head(self.value_net, states, beliefs, features).float()[..., :-1, :]
        critic = two_hot_cross_entropy(prediction, target, value_loss.value_bins)
        if value_loss.slow_critic_regularization:
            slow = self._slow_value(states, beliefs, features)[..., :-1, 0]
            critic = critic + value_loss.slow_critic_regularization * two_hot_cross_entropy(
                prediction, slow, value_loss.value_bins
            )
        return reduce_loss(value_loss, weight.to(critic.dtype) * critic)
