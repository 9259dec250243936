"""The DreamerV3 author's default image CNNs (``{enc,dec}.simple.strided: False``),
selected by ``model.cnn_strided=false``: per stage a kernel-5 stride-1 convolution and
a 2x2 max-pool (encoder), or a 2x nearest-neighbour upsample and the convolution
(decoder), each at its input's full resolution (4x the FLOPs of torchrl's strided CNNs).

torchrl's ``DreamerV3ImageEncoder``/``DreamerV3ImageDecoder`` hard-code stride 2 (the
decoder's transposed convolutions cannot serve as upsample + convolution) and project
the concatenated latent through one block-linear layer; their building blocks are reused."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional

from dreamer.torchrl_compat import (
    BlockLinear,
    ChannelRMSNorm,
    RMSNorm,
    dreamer_v3_conv_init,
    dreamer_v3_init,
)


def _check(depth: int, mults: tuple[int, ...], kernel_size: int) -> None:
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be a positive odd integer, got {kernel_size}")
    if not mults or depth < 1:
        raise ValueError(f"need depth >= 1 and at least one stage, got {depth}, {mults}")


class PoolingImageEncoder(nn.Module):
    """Image ``(*batch, C, H, W)`` (uint8 or float in [0, 1]) to the flattened last
    feature map ``(*batch, output_features((C, H, W)))``, as torchrl's
    ``DreamerV3ImageEncoder``; H and W must be divisible by ``2 ** len(mults)``."""

    def __init__(
        self,
        in_channels: int = 3,
        depth: int = 64,
        mults: tuple[int, ...] = (2, 3, 4, 4),
        kernel_size: int = 5,
        norm_eps: float = 1e-4,
    ):
        super().__init__()
        _check(depth, mults, kernel_size)
        layers = []
        channels = in_channels
        for mult in mults:
            out_channels = depth * mult
            layers += [
                nn.Conv2d(channels, out_channels, kernel_size, padding=kernel_size // 2),
                nn.MaxPool2d(2),
                ChannelRMSNorm(out_channels, norm_eps),
                nn.SiLU(),
            ]
            channels = out_channels
        self.layers = nn.Sequential(*layers)
        self.layers.apply(dreamer_v3_conv_init)
        self.out_channels = channels
        self.factor = 2 ** len(mults)

    def output_features(self, image_shape: tuple[int, int, int]) -> int:
        """The flattened feature count for a ``(C, H, W)`` image."""
        _, height, width = image_shape
        if height % self.factor or width % self.factor:
            raise ValueError(f"image sides {height}x{width} must be multiples of {self.factor}")
        return self.out_channels * (height // self.factor) * (width // self.factor)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if not image.is_floating_point():
            image = image.float() / 255.0
        image = image - 0.5
        batch_shape = image.shape[:-3]
        features = self.layers(image.reshape(-1, *image.shape[-3:]))
        return features.reshape(*batch_shape, -1)


class UpsamplingImageDecoder(nn.Module):
    """Latents ``state`` and ``belief`` to an image ``(*batch, C, H, W)`` in (0, 1).
    ``num_blocks`` (the author's ``bspace``) must divide ``belief_features`` and
    ``depth * mults[-1]``; H and W must be divisible by ``2 ** len(mults)``."""

    def __init__(
        self,
        state_features: int,
        belief_features: int,
        image_shape: tuple[int, int, int] = (3, 64, 64),
        depth: int = 64,
        mults: tuple[int, ...] = (2, 3, 4, 4),
        units: int = 1024,
        kernel_size: int = 5,
        num_blocks: int = 8,
        norm_eps: float = 1e-4,
    ):
        super().__init__()
        _check(depth, mults, kernel_size)
        channels, height, width = image_shape
        factor = 2 ** len(mults)
        if height % factor or width % factor:
            raise ValueError(f"image sides {height}x{width} must be multiples of {factor}")
        top = depth * mults[-1]
        if top % num_blocks or belief_features % num_blocks:
            raise ValueError(
                f"the upsampling image decoder splits the belief ({belief_features}) and the "
                f"smallest feature map's channels (cnn depth {depth} x {mults[-1]} = {top}) "
                f"into {num_blocks} blocks: both must be multiples of {num_blocks}"
            )
        self.num_blocks = num_blocks
        self.initial_shape = (top, height // factor, width // factor)
        size = math.prod(self.initial_shape)
        self.belief_projection = BlockLinear(belief_features, size, num_blocks)
        self.state_projection = nn.Sequential(
            nn.Linear(state_features, 2 * units),
            RMSNorm(2 * units, norm_eps),
            nn.SiLU(),
            nn.Linear(2 * units, size),
        )
        self.state_projection.apply(dreamer_v3_init)
        self.projection_norm = ChannelRMSNorm(top, norm_eps)
        layers = []
        in_channels = top
        for stage in reversed(range(len(mults))):
            last = stage == 0
            out_channels = channels if last else depth * mults[stage - 1]
            layers += [
                nn.Upsample(scale_factor=2, mode="nearest"),
                nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2),
            ]
            if not last:
                layers += [ChannelRMSNorm(out_channels, norm_eps), nn.SiLU()]
            in_channels = out_channels
        self.layers = nn.Sequential(*layers)
        self.layers.apply(dreamer_v3_conv_init)

    def forward(self, state: torch.Tensor, belief: torch.Tensor) -> torch.Tensor:
        batch_shape = belief.shape[:-1]
        channels, height, width = self.initial_shape
        blocks = self.num_blocks
        # block b's outputs are (h, w, c / blocks) and become channels b * c / blocks ...
        spatial = self.belief_projection(belief.reshape(-1, belief.shape[-1]))
        spatial = spatial.reshape(-1, blocks, height, width, channels // blocks)
        spatial = spatial.permute(0, 1, 4, 2, 3).reshape(-1, channels, height, width)
        hidden = self.state_projection(state.reshape(-1, state.shape[-1]))
        hidden = hidden.reshape(-1, height, width, channels).permute(0, 3, 1, 2)
        hidden = functional.silu(self.projection_norm(spatial + hidden))
        image = torch.sigmoid(self.layers(hidden))
        return image.reshape(*batch_shape, *image.shape[-3:])
