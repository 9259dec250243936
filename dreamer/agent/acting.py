"""The acting policy (observation -> posterior latent -> action, the latent carried in
``next``) as torchrl's TensorDict modules, run on tensors where it samples; and the
greedy acting step as a plain tensor module, for ``torch.export`` (tensors in and out):
the same networks, with the recurrent latent as explicit inputs and outputs."""

from __future__ import annotations

import functools

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, TensorDictSequential
from tensordict.nn.probabilistic import interaction_type
from torch import nn
from torch.nn import functional

from dreamer.agent.layout import mask_keys
from dreamer.agent.masked import MaskedMultiHead
from dreamer.agent.spaces import EnvSpaces
from dreamer.torchrl_compat import distribution_sample, update_belief


def env_action(action: torch.Tensor, spaces: EnvSpaces) -> torch.Tensor:
    """The actor's action (one-hot, concatenated one-hots, or a box vector) as the env
    takes it: an index, one index per head, or the vector clipped and rescaled to the
    env's bounds as ``make_env``'s transforms do (unscaled for an unbounded box)."""
    if spaces.action_heads:
        parts = action.split([head.size for head in spaces.action_heads], -1)
        return torch.stack([part.argmax(-1) for part in parts], -1)
    if spaces.discrete:
        return action.argmax(-1)
    if not spaces.action_low:
        return action
    low = torch.tensor(spaces.action_low, dtype=action.dtype, device=action.device)
    high = torch.tensor(spaces.action_high, dtype=action.dtype, device=action.device)
    return low + (action.clamp(-1.0, 1.0) + 1.0) * (high - low) / 2


def posterior_step(rssm, embedding, state, belief, previous_action, is_init):
    """``RSSMStateEstimatorV3``'s step on tensors (``rssm``: anything holding its ``prior``
    and ``posterior``): the latent zeroed where an episode starts, the prior's GRU, the
    posterior's sample; (state, belief) in float32, as it writes them."""
    reset = is_init.reshape(*state.shape[:-1], 1)
    state = torch.where(reset, 0, state)
    belief = torch.where(reset, 0, belief)
    previous_action = torch.where(reset, 0, previous_action)
    belief = update_belief(rssm.prior, state, belief, previous_action)
    _, state = rssm.posterior(belief, embedding)
    return state.float(), belief.float()


class ActingPolicy(TensorDictSequential):
    """torchrl's acting modules in sequence: the encoder, ``RSSMStateEstimatorV3``, the
    actor (its network, then its distribution) and the carry into ``next``. Where the
    actor samples (the collectors' exploration), ``forward`` calls the same modules on
    tensors, with the same random draws in the same order and the same entries written:
    the inference process serves about a call per env step, and TensorDict's dispatch,
    key lookups, per-module writes and the unused log-probability took a fifth of that
    process's CPU (cue, 2 envs, a 2-core Zen 3: 4.0-4.2 -> 3.4-3.5 ms per env step).
    tests/test_acting.py holds it to torchrl's path, outputs and random stream; any other
    interaction type (the evaluation's mode) runs torchrl's path itself."""

    @functools.cached_property
    def actor_requests(self) -> list:
        """What the actor's modules after its network read from the request (the masked
        actor's masks), worked out once, not per call."""
        net, *rest = self.module[2].module
        keys = dict.fromkeys(key for module in rest for key in module.in_keys)
        return [key for key in keys if key not in net.out_keys]

    def forward(self, tensordict: TensorDictBase, tensordict_out=None, **kwargs):
        encoder, estimator, actor, carry = self.module
        net, *middle, distribution = actor.module  # middle: the masked actor's mask filler
        kind = interaction_type() or distribution.default_interaction_type
        if tensordict_out is not None or kwargs or kind is not InteractionType.RANDOM:
            return super().forward(tensordict, tensordict_out, **kwargs)
        embedding = encoder.module(*(tensordict.get(key) for key in encoder.in_keys))
        state, belief, action = (tensordict.get(key) for key in estimator.in_keys[:3])
        reset = tensordict.get(estimator.in_keys[4])
        state, belief = posterior_step(estimator, embedding, state, belief, action, reset)
        latent = dict(zip(estimator.out_keys, (state, belief)))
        params = net.module(*(latent[key] for key in net.in_keys))
        params = dict(zip(net.out_keys, params if isinstance(params, tuple) else (params,)))
        params = TensorDict(params, tensordict.batch_size)
        for key in self.actor_requests:
            if key in tensordict.keys():  # else the mask filler fills it
                params.set(key, tensordict.get(key))
        for module in middle:
            params = module(params)
        dist = distribution.get_dist(params)
        action = distribution_sample(distribution, dist, kind)
        carried = dict(zip(carry.out_keys, carry.module(*latent.values(), action)))
        for key, value in {**latent, distribution.out_keys[0]: action, **carried}.items():
            tensordict.set(key, value)
        return tensordict


class GreedyActingStep(nn.Module):
    """One greedy step: (observations, state, belief, previous action, is_init) -> (env
    action, state, belief, action). ``is_init`` [B] zeroes the latent first; the latent
    is sampled from the posterior (torch's global RNG), the action is the actor's mode."""

    def __init__(self, policy: TensorDictSequential, spaces: EnvSpaces, unimix: float):
        super().__init__()
        encoder, estimator, actor = policy.module[0], policy.module[1], policy.module[2]
        self.encoder = encoder.module
        self.prior = estimator.prior
        self.posterior = estimator.posterior
        self.actor_net = actor.module[0].module
        self.obs_names = [key.name for key in spaces.obs]
        self.spaces = spaces
        self.masks = list(mask_keys(spaces.action_heads))
        self.unimix = unimix

    def forward(
        self,
        observations: dict[str, torch.Tensor],
        state: torch.Tensor,
        belief: torch.Tensor,
        previous_action: torch.Tensor,
        is_init: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        embedding = self.encoder(*(observations[name] for name in self.obs_names))
        state, belief = posterior_step(self, embedding, state, belief, previous_action, is_init)
        action = self._greedy(state, belief, observations)
        return env_action(action, self.spaces), state, belief, action

    def _greedy(self, state, belief, observations) -> torch.Tensor:
        out = self.actor_net(state, belief)  # logits, or (mean, scale) for a box
        if self.spaces.action_heads:
            masks = {key: observations[key] for key in self.masks}
            heads = MaskedMultiHead(out, self.spaces.action_heads, self.unimix, **masks)
            return heads.deterministic_sample
        if self.spaces.discrete:
            return functional.one_hot(out.argmax(-1), out.shape[-1]).float()
        return out[0]
