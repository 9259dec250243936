"""The trainer's OpenMP spin, set before torch loads libgomp (which reads it then).

libgomp lets a thread that waits for work spin ~3 ms before it sleeps on a futex, but
only while the process has no more OpenMP threads than CPUs; past that it spins ~100
iterations. The trainer's driver passes that count (a second thread that ran a parallel
op, torchrl's thread serving the probe policy, keeps a team of its own), so on 2 cores
each of the ~16,000 operators of a CPU update woke its second thread through a futex:
the update took 0.83 s in the loop against 0.43 s alone, 0.53-0.57 s with the full spin
(benchmarks/README.md, "The run"). ``OMP_WAIT_POLICY=ACTIVE`` with ``GOMP_SPINCOUNT``
at libgomp's own default gives every wait the ~3 ms spin; a thread still sleeps once
its team idles longer (between update bursts). A user's own setting of either wins.

A learner on a GPU gets ``OMP_WAIT_POLICY=PASSIVE`` instead: its few host threads
only sample and launch kernels, and a spinning team would take the cores its env
workers and inference process need (the first H200 run: 16 spinning threads beside 16
env workers). torch is not loaded yet, so "on a GPU" is read from the command line and
the NVIDIA driver's list of GPUs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SPIN = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}  # libgomp's default count
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


def choose_wait_policy(argv: list[str] | None = None, gpus: Path = NVIDIA_GPUS) -> dict[str, str]:
    """Sets ``SPIN`` (a CPU learner) or ``SLEEP`` (a GPU learner) in this process's
    environment unless the user set either variable; returns what it set."""
    if any(name in os.environ for name in SPIN):
        return {}
    chosen = SLEEP if gpu_learner(sys.argv[1:] if argv is None else argv, gpus) else SPIN
    os.environ.update(chosen)
    return dict(chosen)
