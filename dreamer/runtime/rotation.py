"""A run directory's checkpoints by their file names (``checkpoint-<env step>.pt``),
without reading them: what a command line needs to pick the run it resumes before it
imports torch. Reading and writing them: ``dreamer.runtime.checkpoint``."""

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
