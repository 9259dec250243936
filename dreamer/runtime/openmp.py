"""The trainer's OpenMP wait policy, set before torch loads libgomp (which reads it then).

A CPU learner gets ``OMP_WAIT_POLICY=ACTIVE`` and ``GOMP_SPINCOUNT=1000``: each of a CPU
update's ~16,000 operators makes its second thread wait, and this short spin measured
best in the loop against libgomp's ~3 ms default and the 100 iterations it falls to
with more OpenMP threads than CPUs (benchmarks/README.md, "The run"). The driver keeps
one OpenMP team so that the count holds (``torchrl_compat.push_weights``).

A GPU learner gets ``OMP_WAIT_POLICY=PASSIVE``: its few host threads only launch kernels,
and a spinning team would take the cores its env workers and inference process need.
torch is not loaded yet, so "on a GPU" is read from the command line and the NVIDIA
driver. A user's own setting of either variable wins."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SPIN = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "1000"}
SLEEP = {"OMP_WAIT_POLICY": "PASSIVE"}
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees


def gpu_learner(argv: list[str], gpus: Path = NVIDIA_GPUS) -> bool:
    """Will ``learner.device`` (auto unless the command line says) resolve to a GPU?"""
    devices = [arg.split("=", 1)[1] for arg in argv if arg.startswith("learner.device=")]
    if devices and devices[-1] == "cpu":
        return False
    if os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return False
    return gpus.is_dir() and any(gpus.iterdir())


_CHOSEN: dict[str, str] = {}  # what this process's choose_wait_policy set


def choose_wait_policy(argv: list[str] | None = None, gpus: Path = NVIDIA_GPUS) -> dict[str, str]:
    """Sets ``SPIN`` (a CPU learner) or ``SLEEP`` (a GPU learner) in this process's
    environment unless the user set either variable; returns what it set."""
    if any(name in os.environ for name in SPIN):
        return {}
    chosen = SLEEP if gpu_learner(sys.argv[1:] if argv is None else argv, gpus) else SPIN
    os.environ.update(chosen)
    _CHOSEN.update(chosen)
    return dict(chosen)


def chosen_wait_policy() -> dict[str, str]:
    """What ``choose_wait_policy`` set in this process (empty: the user's own, or none)."""
    return dict(_CHOSEN)
