"""A DreamerV3 actor for masked multi-head discrete actions (MineDojo's), which torchrl's
``DreamerV3DiscreteActor`` (one categorical, no masks) cannot express.

Head 0 is the *root*; every other head is always used or *gated*: used only after given
root choices, each with its own mask (a boolean observation entry; absent, as in
imagined states: all valid). A root choice whose gated heads have no valid argument is
invalid, so a sampled action is always one the env accepts. Unimix mixes in the uniform
over valid choices only. Log-probability and entropy are the joint action's: a gated
head counts only where used, its entropy weighted by its root choices' probability."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictModuleBase,
)
from torch import nn
from torch.distributions import Distribution
from torch.nn import functional
from torchrl.modules import DreamerV3MLP

from dreamer.agent.layout import Head, mask_keys
from dreamer.torchrl_compat import dreamer_v3_init


def _mixed_log_probs(logits: torch.Tensor, valid: torch.Tensor, unimix: float) -> torch.Tensor:
    """Log of (1 - unimix) * masked softmax + unimix * uniform over the valid choices; -inf
    on invalid ones (a row with none valid, for an invalid root choice, is left unmasked)."""
    valid = valid | ~valid.any(-1, keepdim=True)
    probs = torch.softmax(logits.masked_fill(~valid, float("-inf")), -1)
    if unimix:
        uniform = valid.float() / valid.sum(-1, keepdim=True)
        probs = (1 - unimix) * probs + unimix * uniform
    return probs.log().masked_fill(~valid, float("-inf"))


def _entropy(log_probs: torch.Tensor) -> torch.Tensor:
    plogp = log_probs.exp() * log_probs
    return -torch.where(torch.isfinite(log_probs), plogp, 0.0).sum(-1)


def _sample(log_probs: torch.Tensor, greedy: bool) -> torch.Tensor:
    if greedy:
        return log_probs.argmax(-1)
    flat = log_probs.exp().reshape(-1, log_probs.shape[-1])
    return torch.multinomial(flat, 1).reshape(log_probs.shape[:-1])


class MaskedMultiHead(Distribution):
    """The joint distribution of a masked multi-head action; samples are the heads'
    one-hot vectors concatenated (torchrl's ``MultiOneHot`` layout). An unused gated
    head emits choice 0, which the environment ignores."""

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(self, logits: torch.Tensor, heads: tuple[Head, ...], unimix: float, **masks):
        self.sizes = [head.size for head in heads]
        parts = logits.float().split(self.sizes, -1)
        batch_shape = logits.shape[:-1]

        def valid(key: str | None, size: int) -> torch.Tensor:
            if key is None or masks.get(key) is None:
                return torch.ones(*batch_shape, size, dtype=torch.bool, device=logits.device)
            return masks[key].to(torch.bool).expand(*batch_shape, size)

        root_valid = valid(heads[0].mask, heads[0].size).clone()
        # per head: list of (root choice or None, log-probs under the mask that applies)
        self.branches: list[list[tuple[int | None, torch.Tensor]]] = [[]]
        for head, head_logits in zip(heads[1:], parts[1:]):
            if not head.gated_by:
                always = _mixed_log_probs(head_logits, valid(head.mask, head.size), unimix)
                self.branches.append([(None, always)])
                continue
            branches = []
            for choice, key in head.gated_by:
                head_valid = valid(key, head.size)
                if head.mask:
                    head_valid = head_valid & valid(head.mask, head.size)
                root_valid[..., choice] &= head_valid.any(-1)
                branches.append((choice, _mixed_log_probs(head_logits, head_valid, unimix)))
            self.branches.append(branches)
        self.root = _mixed_log_probs(parts[0], root_valid, unimix)
        super().__init__(batch_shape=batch_shape, validate_args=False)

    def _draw(self, greedy: bool) -> torch.Tensor:
        root = _sample(self.root, greedy)
        chosen = [root]
        for branches in self.branches[1:]:
            if branches[0][0] is None:
                chosen.append(_sample(branches[0][1], greedy))
                continue
            index = torch.zeros_like(root)
            for choice, log_probs in branches:
                index = torch.where(root == choice, _sample(log_probs, greedy), index)
            chosen.append(index)
        return torch.cat(
            [functional.one_hot(i, size) for i, size in zip(chosen, self.sizes)], -1
        ).float()

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:
        if sample_shape:
            raise NotImplementedError("MaskedMultiHead draws one action per batch entry")
        with torch.no_grad():
            return self._draw(greedy=False)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        return self._draw(greedy=True)

    @property
    def mode(self) -> torch.Tensor:
        return self.deterministic_sample

    def indices(self, action: torch.Tensor) -> list[torch.Tensor]:
        return [part.argmax(-1) for part in action.split(self.sizes, -1)]

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        chosen = self.indices(action)
        root = chosen[0]
        total = self.root.gather(-1, root.unsqueeze(-1)).squeeze(-1)
        for branches, index in zip(self.branches[1:], chosen[1:]):
            for choice, log_probs in branches:
                head_lp = log_probs.gather(-1, index.unsqueeze(-1)).squeeze(-1)
                total = total + (
                    head_lp if choice is None else torch.where(root == choice, head_lp, 0.0)
                )
        return total

    def entropy(self) -> torch.Tensor:
        total = _entropy(self.root)
        root_probs = self.root.exp()
        for branches in self.branches[1:]:
            for choice, log_probs in branches:
                weight = 1.0 if choice is None else root_probs[..., choice]
                total = total + weight * _entropy(log_probs)
        return total


class _AllValidIfAbsent(TensorDictModuleBase):
    """Declares the mask keys as policy inputs (the collector ships only declared keys)
    and fills absent ones with "all valid" (imagined states carry no observations)."""

    def __init__(self, sizes: dict[str, int]):
        super().__init__()
        self.sizes = sizes
        self.in_keys = list(sizes)
        self.out_keys = list(sizes)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        device = tensordict.device
        if device is None:  # made where the states are: no host tensor in a captured step
            device = next(iter(tensordict.values(True, True))).device
        for key, size in self.sizes.items():
            if key not in tensordict.keys():
                tensordict.set(
                    key, torch.ones(*tensordict.batch_size, size, dtype=torch.bool, device=device)
                )
        return tensordict


class _LogitsNet(nn.Module):
    """torchrl's DreamerV3 actor trunk with one linear output over all heads."""

    def __init__(self, in_features: int, out_features: int, depth: int, units: int):
        super().__init__()
        self.backbone = DreamerV3MLP(in_features, None, depth=depth, num_cells=units)
        self.logits = nn.Linear(units, out_features)
        self.logits.apply(dreamer_v3_init)
        with torch.no_grad():
            self.logits.weight.mul_(0.01)

    def forward(self, state: torch.Tensor, belief: torch.Tensor) -> torch.Tensor:
        return self.logits(self.backbone(belief, state)).float()


def masked_multi_head_actor(
    in_features: int, heads: tuple[Head, ...], *, depth: int, units: int, unimix: float
) -> ProbabilisticTensorDictSequential:
    """The actor: writes ``logits``, the concatenated one-hot ``action`` and its
    ``action_log_prob``; ``get_dist`` gives the ``MaskedMultiHead`` distribution."""
    masks = mask_keys(heads)
    return ProbabilisticTensorDictSequential(
        TensorDictModule(
            _LogitsNet(in_features, sum(head.size for head in heads), depth, units),
            in_keys=["state", "belief"],
            out_keys=["logits"],
        ),
        _AllValidIfAbsent(masks),
        ProbabilisticTensorDictModule(
            in_keys={"logits": "logits", **{key: key for key in masks}},
            out_keys=["action"],
            distribution_class=MaskedMultiHead,
            distribution_kwargs={"heads": heads, "unimix": unimix},
            default_interaction_type=InteractionType.RANDOM,
            return_log_prob=True,
            log_prob_key="action_log_prob",
        ),
    )
