"""The world model's posterior rollout over a replayed window, started from zeros."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.modules import RSSMRolloutV3

LATENT_KEYS = ("state", "belief")


class ZeroStartRollout(RSSMRolloutV3):
    """torchrl's ``RSSMRolloutV3`` with every window's first latent zero.

    Replay stores no latent: the acting latents were ~10 KB per step at size12m, only
    a window's first one was read, and it came from weights many updates old. A zero
    latent is what every episode starts from, and what DreamerV2 and torchrl's own
    Dreamer start each replayed window from.
    """

    def __init__(self, rssm_prior, rssm_posterior, reset_key="is_init"):
        super().__init__(rssm_prior, rssm_posterior, reset_key=reset_key)
        prior = rssm_prior.module
        self.state_size = prior.num_categoricals * prior.num_classes
        self.belief_size = prior.rnn_hidden_dim
        self.in_keys = [key for key in self.in_keys if key not in LATENT_KEYS]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        device = tensordict.get(self.action_key).device
        tensordict = tensordict.copy()  # the caller's sample is left as it was
        for key, size in zip(LATENT_KEYS, (self.state_size, self.belief_size)):
            zero = torch.zeros(size, device=device).expand(*tensordict.batch_size, size)
            tensordict.set(key, zero)
        return super().forward(tensordict)
