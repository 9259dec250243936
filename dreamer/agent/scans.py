"""The DreamerV3 loss's sequential parts as tensor functions over torchrl's networks,
reading their parameters at each call and owning nothing. Not torchrl's rollouts
(tests/test_fused.py holds these equal): what does not depend on the recurrence runs once
over all B x T steps, and imagination runs without autograd (torchrl detaches it all)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional
from torchrl.modules import DreamerV3MLP

from dreamer.torchrl_compat import (
    BlockLinear,
    RMSNorm,
    dist_sample,
    straight_through_categorical,
)


def two_hot_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, bins: torch.Tensor
) -> torch.Tensor:
    """torchrl's ``two_hot_cross_entropy`` (same values and gradients) on the two bins around
    each target, not a dense two-hot target: compiled, torchrl's took 37 ms, this 13 ms."""
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


# MKL's fp32 product is slow on output widths not a multiple of 16 (the two-hot heads'
# 64 -> 255 layer: 14.8 ms against 6.5 ms for 256), so such a layer multiplies weights
# padded with zero rows and slices the padding off: the same values (tests/test_fused.py).
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
    """A torchrl Sequential run without the per-module call overhead."""
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
    """torchrl's ``RSSMPriorV3`` (block GRU) and ``RSSMPosteriorV3`` as tensor functions."""

    def __init__(self, prior: nn.Module, posterior: nn.Module):
        if prior.recurrent_model != "block_gru":
            raise ValueError("the loss's RSSM scan needs the block-GRU RSSM")
        rnn = prior.rnn
        first = rnn.hidden_layers[0]
        if not isinstance(first, BlockLinear) or len(rnn.hidden_layers) != 3:
            raise ValueError("the loss's RSSM scan needs one block-linear GRU layer")
        self.prior, self.posterior, self.rnn = prior, posterior, rnn
        self.blocks = rnn.num_blocks
        self.deter = rnn.belief_dim
        self.hidden = rnn.belief_projection[0].out_features
        self.stoch = prior.num_categoricals * prior.num_classes

    # -- pieces of the block GRU's first layer -----------------------------------
    def _split_first_layer(self):
        """The first block-linear layer as (belief weights per block, dense feature weights
        of belief, state and action, bias): every block sees the same features."""
        layer = self.rnn.hidden_layers[0]
        weight = layer.weight  # [blocks, belief/blocks + 3 * hidden, out/blocks]
        per_block = self.deter // self.blocks
        on_belief = weight[:, :per_block].contiguous()
        features = weight[:, per_block:].permute(1, 0, 2).reshape(3 * self.hidden, -1)
        h = self.hidden
        return on_belief, features[:h], features[h : 2 * h], features[2 * h :], layer.bias

    def action_term(self, action: torch.Tensor, split) -> torch.Tensor:
        """The action's term in the GRU's first layer, bias included (for all steps at once)."""
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
        # one draw for prior (unused) and posterior, as torchrl's: the same random stream
        uniforms = torch.rand(
            length, 2, *action.shape[:-2], self.prior.num_categoricals, device=action.device
        )
        split = self._split_first_layer()
        # the start as the steps after the first get theirs (requiring grad), else a
        # compiled posterior step traces and compiles twice (~9 s cold at size1m)
        if torch.is_grad_enabled() and not state.requires_grad:
            state, belief = state.detach().requires_grad_(), belief.detach().requires_grad_()
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
        # drawn here, not in the compiled step, which then keeps the eager random stream
        uniform = torch.rand(*state.shape[:-1], self.prior.num_categoricals, device=state.device)
        return self.prior_step(state, belief, action, uniform, split)

    def prior_step(self, state, belief, action, uniform, split):
        if not action.is_floating_point():
            action = action.to(belief.dtype)
        belief = self.belief_step(state, belief, self.action_term(action, split), split)
        return self.sample(self.prior_logits(belief), self.prior.unimix, uniform), belief

    def compile(self, backend="inductor") -> None:
        """Compile the per-step functions the rollouts call 64 and 15 times per update."""
        options = {"dynamic": False, "fullgraph": True, "backend": backend}
        self.posterior_step = torch.compile(self.posterior_step, **options)
        self.prior_step = torch.compile(self.prior_step, **options)


class ActorParts:
    """A torchrl actor (network, then distribution module) called on tensors."""

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
            # absent (imagined states' action masks): None, "every choice valid" as in get_dist
            kwargs[dist_key[-1] if isinstance(dist_key, tuple) else dist_key] = out.get(td_key)
        return module.distribution_class(**kwargs, **dict(module.distribution_kwargs))

    def sample(self, dist) -> torch.Tensor:
        return dist_sample(self.dist_module, dist)


def head_output(net: nn.Module, state, belief, features=None) -> torch.Tensor:
    """A (state, belief) head's output; a ``DreamerV3MLP`` takes ``features`` (the two
    already concatenated, shared by every head) instead of concatenating them again."""
    if features is not None and type(net) is DreamerV3MLP:
        return _run(net.model, features)
    return net(state, belief)
