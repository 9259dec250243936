"""The trainer's OpenMP spin, set before torch loads libgomp (which reads it then).

libgomp lets a thread that waits for work spin a while (``GOMP_SPINCOUNT`` iterations,
~3 ms by default) before it sleeps on a futex, but only while the process has no more
OpenMP threads than CPUs; past that, 1,000 iterations under ``OMP_WAIT_POLICY=ACTIVE``
and 100 without. Each of the ~16,000 operators of a CPU update makes the learner's
second thread wait: at 100 iterations it slept on a futex each time, and the update took
0.83 s in the loop against 0.43 s alone. ``OMP_WAIT_POLICY=ACTIVE`` with
``GOMP_SPINCOUNT=1000`` gives every wait that short spin, measured best in the loop
(2-core runs of the trainer, 0.49-0.54 s per update; 0.56-0.61 s with
libgomp's ~3 ms default, which wins only for the update alone, and 0.72 s at 100
iterations: benchmarks/README.md, "The run"). The driver keeps one OpenMP team so that
this count holds (``torchrl_compat.push_weights``). A user's own setting of either wins.

A learner on a GPU gets ``OMP_WAIT_POLICY=PASSIVE`` instead: its few host threads
only sample and launch kernels, and a spinning team would take the cores its env
workers and inference process need (the first H200 run: 16 spinning threads beside 16
env workers). torch is not loaded yet, so "on a GPU" is read from the command line and
the NVIDIA driver's list of GPUs."""

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
