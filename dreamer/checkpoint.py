"""Atomic checkpoints: written to a temporary file, fsynced, then renamed into place,
so a crash mid-write leaves the previous checkpoint intact."""

from __future__ import annotations

import os
from pathlib import Path

import torch

PREFIX = "checkpoint-"


def checkpoint_dir(logdir: Path) -> Path:
    return logdir / "checkpoints"


def save(logdir: Path, step: int, state: dict, keep: int = 3) -> Path:
    folder = checkpoint_dir(logdir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{PREFIX}{step:012d}.pt"
    temporary = folder / f".{final.name}.tmp"
    with temporary.open("wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    for old in sorted(folder.glob(f"{PREFIX}*.pt"))[:-keep]:
        old.unlink()
    return final


def latest(logdir: Path) -> Path | None:
    found = sorted(checkpoint_dir(logdir).glob(f"{PREFIX}*.pt"))
    return found[-1] if found else None


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)
