"""The cores this process may use: the one count every pool and worker size starts from.

``os.cpu_count()`` counts the machine's cores; a SLURM job (its cgroup cpuset or task
affinity), ``taskset`` or a container's cpuset allows fewer, and sizing pools from the
machine's count oversubscribes the allowed ones (a 2-CPU allocation on a 64-core node).
The affinity mask is what those set, so it is what counts here.
"""

from __future__ import annotations

import os


def allowed_cores() -> list[int]:
    """The ids of the cores this process may run on, in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))  # no affinity masks here (macOS, Windows)


def usable_cores() -> int:
    """How many cores this process may run on (at least 1)."""
    return max(len(allowed_cores()), 1)
