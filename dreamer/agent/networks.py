"""Networks torchrl does not ship: a multi-key observation encoder and decoder (torchrl's
DreamerV3 modules take one image or one vector, MineDojo or robotics give several keys)
and a continuous actor head. The author's stride-1 CNNs are in ``cnn.py``."""

from __future__ import annotations

import torch
from torch import nn
from torchrl.modules import DreamerV3ImageDecoder, DreamerV3ImageEncoder, DreamerV3MLP
from torchrl.objectives.dreamer_v3 import symexp, symlog

from dreamer.agent.cnn import PoolingImageEncoder, UpsamplingImageDecoder
from dreamer.agent.spaces import EnvSpaces
from dreamer.torchrl_compat import dreamer_v3_init

CNN_MULTS = (2, 3, 4, 4)


class MultiEncoder(nn.Module):
    """Images through a CNN, symlog vectors through an MLP, concatenated; inputs come in
    the order of ``spaces.obs``."""

    def __init__(
        self, spaces: EnvSpaces, cnn_depth: int, units: int, layers: int, strided: bool = True
    ):
        super().__init__()
        self.kinds = [key.kind for key in spaces.obs]
        cnn = DreamerV3ImageEncoder if strided else PoolingImageEncoder
        self.cnns = nn.ModuleList(
            cnn(key.shape[-1], depth=cnn_depth, mults=CNN_MULTS) for key in spaces.image_keys
        )
        image_features = sum(
            cnn.output_features((key.shape[-1], *key.shape[:2]))
            for cnn, key in zip(self.cnns, spaces.image_keys, strict=True)
        )
        vector_size = sum(key.size for key in spaces.vector_keys)
        self.mlp = (
            DreamerV3MLP(vector_size, None, depth=layers, num_cells=units) if vector_size else None
        )
        self.out_features = image_features + (units if vector_size else 0)

    def forward(self, *observations: torch.Tensor) -> torch.Tensor:
        images = [obs for obs, kind in zip(observations, self.kinds) if kind == "image"]
        vectors = [obs for obs, kind in zip(observations, self.kinds) if kind == "vector"]
        features = [cnn(image.movedim(-1, -3)) for cnn, image in zip(self.cnns, images)]
        if self.mlp is not None:
            flat = torch.cat([vector.float() for vector in vectors], -1)
            features.append(self.mlp(symlog(flat)))
        return torch.cat(features, -1) if len(features) > 1 else features[0]


class MultiDecoder(nn.Module):
    """Reconstructs every observation key from the latent: images HWC in [0, 1] (compared
    with target / 255), vectors through symexp (the loss compares them in symlog space)."""

    def __init__(
        self,
        spaces: EnvSpaces,
        in_features: int,
        cnn_depth: int,
        units: int,
        layers: int,
        strided: bool = True,
        state_features: int | None = None,
    ):
        """``state_features``: the stochastic state's size, needed when not ``strided``."""
        super().__init__()
        self.kinds = [key.kind for key in spaces.obs]
        self.strided = strided
        if strided:
            self.cnns = nn.ModuleList(
                DreamerV3ImageDecoder(
                    in_features,
                    (key.shape[-1], *key.shape[:2]),
                    depth=cnn_depth,
                    mults=CNN_MULTS,
                )
                for key in spaces.image_keys
            )
        else:
            if state_features is None:
                raise ValueError("the stride-1 image decoder needs state_features")
            self.cnns = nn.ModuleList(
                UpsamplingImageDecoder(
                    state_features,
                    in_features - state_features,
                    (key.shape[-1], *key.shape[:2]),
                    depth=cnn_depth,
                    mults=CNN_MULTS,
                    units=units,
                )
                for key in spaces.image_keys
            )
        self.vector_sizes = [key.size for key in spaces.vector_keys]
        self.vector_shapes = [key.shape for key in spaces.vector_keys]
        self.mlp = None
        if self.vector_sizes:
            self.mlp = DreamerV3MLP(in_features, None, depth=layers, num_cells=units)
            self.heads = nn.ModuleList(nn.Linear(units, size) for size in self.vector_sizes)
            self.heads.apply(dreamer_v3_init)

    def forward(self, state: torch.Tensor, belief: torch.Tensor) -> tuple[torch.Tensor, ...]:
        features = torch.cat([state, belief], -1)
        latent = (features,) if self.strided else (state, belief)
        images = iter([cnn(*latent).float().movedim(-3, -1) for cnn in self.cnns])
        vectors = iter(())
        if self.mlp is not None:
            hidden = self.mlp(features)
            vectors = iter(
                symexp(head(hidden).float()).reshape(*hidden.shape[:-1], *shape)
                for head, shape in zip(self.heads, self.vector_shapes)
            )
        return tuple(next(images) if kind == "image" else next(vectors) for kind in self.kinds)


class ContinuousActorNet(nn.Module):
    """Gaussian actor head for box actions (torchrl only ships the discrete one)."""

    def __init__(self, in_features: int, action_dim: int, units: int, layers: int):
        super().__init__()
        self.backbone = DreamerV3MLP(in_features, None, depth=layers, num_cells=units)
        self.mean = nn.Linear(units, action_dim)
        self.std = nn.Linear(units, action_dim)
        for head in (self.mean, self.std):
            dreamer_v3_init(head)
            with torch.no_grad():
                head.weight.mul_(0.01)
        self.min_std, self.max_std = 0.1, 1.0

    def forward(
        self, state: torch.Tensor, belief: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.backbone(belief, state)
        mean = self.mean(hidden).tanh()
        std = (self.max_std - self.min_std) * torch.sigmoid(self.std(hidden) + 2) + self.min_std
        return mean.float(), std.float()


class ToFloat(nn.Module):
    def forward(self, value: torch.Tensor) -> torch.Tensor:
        return value.float()


class Carry(nn.Module):
    """Copies the acting state into ``next`` so the env's step_mdp carries it."""

    def forward(
        self, state: torch.Tensor, belief: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return state.float(), belief.float(), action.float()
