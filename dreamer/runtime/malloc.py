"""When a process gives freed memory back to the OS (glibc only): never on its own in a
learner's process (``keep_freed_memory``), at each completed replay chunk
(``release_freed_memory``). A user's ``MALLOC_*`` or ``GLIBC_TUNABLES`` setting wins.

glibc hands a large block (past a threshold that rises to 32 MB) to the kernel on
``free`` and trims the heap's free top past twice that, so each CPU update of size1m
(~220 MB of tensors made and freed) page-faulted its working set back in, ~12% of its
time (benchmarks/README.md, "The run"). With both thresholds fixed high the learner
keeps its largest update's working set, which the next update needs anyway."""

from __future__ import annotations

import ctypes
import functools
import os
import platform

M_TRIM_THRESHOLD = -1  # malloc.h
M_MMAP_THRESHOLD = -3
SETTINGS = {M_MMAP_THRESHOLD: 1 << 30, M_TRIM_THRESHOLD: 2**31 - 1}  # 1 GiB, 2 GiB
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_kept = False


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """This process's C library where it is glibc."""
    return ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None


def keep_freed_memory() -> bool:
    """Sets ``SETTINGS`` once per process; whether they are in effect."""
    global _kept
    if _kept:
        return True
    libc = _glibc()
    if libc is None or any(name in os.environ for name in USER_SETTINGS):
        return False
    _kept = all(libc.mallopt(option, value) == 1 for option, value in SETTINGS.items())
    return _kept


def release_freed_memory() -> None:
    """Give the heap's free pages back to the OS now (``malloc_trim``): chunk-sized blocks
    freed between long-lived ones stay resident otherwise (a disk replay grew ~1 GB per
    100k 64x64 frames, ``tests/test_replay_memory.py``)."""
    if (libc := _glibc()) is not None:
        libc.malloc_trim(0)
