"""What the agent takes in and gives out, as plain data that the env adapters read
without importing torch: what an image observation is, and an action layout of several
discrete heads (``dreamer.agent.masked`` acts with it): what each head chooses among
and which mask observations gate it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Head:
    """One action head: ``size`` choices, an optional mask observation key, and for an
    argument head the root choices that use it, each with the mask that applies."""

    size: int
    mask: str | None = None
    gated_by: tuple[tuple[int, str], ...] = ()


def mask_keys(heads: tuple[Head, ...]) -> dict[str, int]:
    """Every mask observation key of a layout, with its size."""
    keys = {}
    for head in heads:
        if head.mask:
            keys[head.mask] = head.size
        for _, key in head.gated_by:
            keys[key] = head.size
    return keys


def image_shaped(shape: tuple[int, ...], uint8: bool) -> bool:
    """An image observation: height x width x 1 or 3 channels of uint8 (the one rule the
    env wrappers, which resize and pool such frames, and the agent's encoders share)."""
    return len(shape) == 3 and shape[-1] in (1, 3) and uint8
