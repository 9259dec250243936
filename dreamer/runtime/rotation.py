"""A run directory's checkpoints by their file names (``checkpoint-<env step>.pt``), for
a command line before it imports torch; reading and writing them is
``dreamer.runtime.checkpoint``'s."""

from __future__ import annotations

import re
from pathlib import Path

PREFIX = "checkpoint-"


def checkpoint_dir(logdir: Path) -> Path:
    return logdir / "checkpoints"


def rotation(logdir: Path) -> list[Path]:
    """The checkpoints kept, oldest first."""
    return sorted(checkpoint_dir(logdir).glob(f"{PREFIX}*.pt"))


def latest(logdir: Path) -> Path | None:
    found = rotation(logdir)
    return found[-1] if found else None


def saved_steps(logdir: Path) -> list[int]:
    """The env steps of the checkpoints in the rotation."""
    found = (re.fullmatch(rf"{PREFIX}(\d+)\.pt", path.name) for path in rotation(logdir))
    return sorted(int(match[1]) for match in found if match)


class CheckpointError(OSError):
    """One line; ``reason``: what is wrong with the file, without its name."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


def find(path: str | Path, name: str | None = None) -> Path:
    """The checkpoint a user names: a file, the latest in a run directory or its
    ``checkpoints``, or ``name`` (a file, or one in ``checkpoints``); else ``CheckpointError``."""
    path = Path(path)
    if name is not None:
        for candidate in (Path(name), checkpoint_dir(path) / name):
            if candidate.is_file():
                return candidate
        raise CheckpointError(f"{name}: no such checkpoint file (nor in {checkpoint_dir(path)})")
    if path.is_dir():
        found = latest(path.parent if path.name == "checkpoints" else path)
        if found is None:
            raise CheckpointError(f"{path}: no checkpoint in it (expected {PREFIX}*.pt files)")
        return found
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file or run directory")
    return path
