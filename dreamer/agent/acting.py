"""The greedy acting step as a plain tensor module, for ``torch.export`` (which needs
tensors in and out, where the collector and ``dreamer.Policy`` act through a TensorDict
policy): the same networks, with the recurrent latent as explicit inputs and outputs."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictSequential
from torch import nn
from torch.nn import functional

from dreamer.agent.layout import mask_keys
from dreamer.agent.masked import MaskedMultiHead
from dreamer.agent.spaces import EnvSpaces
from dreamer.torchrl_compat import update_belief


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
        reset = is_init.reshape(-1, 1)
        state = torch.where(reset, 0, state)
        belief = torch.where(reset, 0, belief)
        previous_action = torch.where(reset, 0, previous_action)
        belief = update_belief(self.prior, state, belief, previous_action)
        _, state = self.posterior(belief, embedding)
        action = self._greedy(state.float(), belief.float(), observations)
        return env_action(action, self.spaces), state.float(), belief.float(), action

    def _greedy(self, state, belief, observations) -> torch.Tensor:
        out = self.actor_net(state, belief)  # logits, or (mean, scale) for a box
        if self.spaces.action_heads:
            masks = {key: observations[key] for key in self.masks}
            heads = MaskedMultiHead(out, self.spaces.action_heads, self.unimix, **masks)
            return heads.deterministic_sample
        if self.spaces.discrete:
            return functional.one_hot(out.argmax(-1), out.shape[-1]).float()
        return out[0]
