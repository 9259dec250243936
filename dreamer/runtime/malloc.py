"""When a process gives freed memory back to the OS: glibc's automatic giving back is
off in a learner's process (``keep_freed_memory``, ``mallopt``), and the replay gives
back at each completed chunk (``release_freed_memory``, ``malloc_trim``). Each half was
measured without the other (AMD EPYC Zen 4, 2026-12-06): without the trim a disk replay
under load grew ~342 MB (``tests/test_replay_memory.py``); without the thresholds each
update page-faults its working set back in (below).

A learner's process keeps the memory its update frees:

glibc hands a large block (past a threshold that starts at 128 KB and rises with the
blocks freed, to 32 MB at most) to the kernel on ``free`` and trims the heap's free top
past twice that: each CPU update of size1m (~220 MB of tensors made and freed) then
page-faulted ~56,000 times, ~12% of its time (0.466 -> 0.410 s per update in the loop,
0 faults: benchmarks/README.md at commit d62db39, "The run"). With both thresholds fixed
high the update's blocks are reused from one update to the next; the process keeps its
largest update's working set, which it needs again at the next update anyway.

Not the env workers or the inference process (other processes, small allocations);
elsewhere than glibc, and where the user set glibc's ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` (or any ``GLIBC_TUNABLES``), nothing changes."""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # malloc.h
M_MMAP_THRESHOLD = -3
SETTINGS = {M_MMAP_THRESHOLD: 1 << 30, M_TRIM_THRESHOLD: 2**31 - 1}  # 1 GiB, 2 GiB
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_kept = False


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
    """Give the heap's free pages back to the OS now (``malloc_trim``). Chunk-sized
    blocks freed between long-lived ones stay in glibc's heap, counted as resident: a
    disk replay's resident memory grew with the data that way (by ~1 GB per 100k 64x64
    frames in ``tests/test_replay_memory.py``), although nothing held them."""
    global _libc
    if _libc is None:
        _libc = _glibc() or False
    if _libc:
        _libc.malloc_trim(0)


_libc: ctypes.CDLL | None | bool = None
