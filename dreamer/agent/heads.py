"""An action layout of several discrete heads (``dreamer.agent.masked`` acts with it):
what each head chooses among and which mask observations gate it. Plain data, read by
the env adapters that describe their actions without importing torch."""

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
