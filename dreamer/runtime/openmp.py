"""The trainer's OpenMP spin, set before torch loads libgomp (which reads it then).

libgomp lets a thread that waits for work spin ~3 ms before it sleeps on a futex, but
only while the process has no more OpenMP threads than CPUs; past that it spins ~100
iterations. The trainer's driver passes that count (a second thread that ran a parallel
op, torchrl's thread serving the probe policy, keeps a team of its own), so on 2 cores
each of the ~16,000 operators of a CPU update woke its second thread through a futex:
the update took 0.83 s in the loop against 0.43 s alone, 0.53-0.57 s with the full spin
(benchmarks/README.md, "The run"). ``OMP_WAIT_POLICY=ACTIVE`` with ``GOMP_SPINCOUNT``
at libgomp's own default gives every wait the ~3 ms spin; a thread still sleeps once
its team idles longer (between update bursts). A user's own setting of either wins."""

from __future__ import annotations

import os

SPIN = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}  # libgomp's default count


def spin_like_libgomp_default() -> dict[str, str]:
    """Sets ``SPIN`` in this process's environment unless either variable is set;
    returns what it set."""
    if any(name in os.environ for name in SPIN):
        return {}
    os.environ.update(SPIN)
    return dict(SPIN)
