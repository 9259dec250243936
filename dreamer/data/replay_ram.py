"""The replay's RAM: chunk buffers reused rather than freed, and what the machine allows
(the heap's freed pages are given back by ``dreamer.runtime.malloc``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

SPARE = 2  # chunks kept for reuse


class SpareChunks:
    """Chunks whose buffers nothing reads any more, kept for the next ones: freed and
    allocated again, they fragmented the heap (a disk replay grew by half its data)."""

    def __init__(self):
        self.chunks: list[dict[str, torch.Tensor]] = []

    def keep(self, chunk: dict[str, torch.Tensor]) -> None:
        if len(self.chunks) < SPARE:
            self.chunks.append(chunk)

    def new(self, fields: list, rows: int) -> dict[str, torch.Tensor]:
        """A chunk of ``rows`` zeros per field: a spare one if there is one."""
        if self.chunks:
            chunk = self.chunks.pop()
            for tensor in chunk.values():
                tensor.zero_()
            return chunk
        return {
            field.name: torch.zeros((rows, *field.stored_shape), dtype=field.stored_dtype)
            for field in fields
        }


def memory_limit() -> int:
    """This machine's RAM, or the cgroup's limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(limit).read_text().strip()))  # "max": no limit
    return total
