"""Everything a resume needs, on disk safely.

- ``save``/``latest``/``load``: atomic checkpoints (temporary file, fsync, rename), so
  a crash mid-write leaves the previous checkpoint intact; the last ``keep`` are kept.
- ``Registry``: each stateful part registers by name; one call saves or restores all.
- ``RunLock``: one process per run directory (an OS file lock: a killed holder frees it).
- ``StopSignals``: SIGTERM/SIGUSR1 (SLURM's preemption and time-limit warnings) ask the
  loop to checkpoint and exit with ``REQUEUE_EXIT``; ``children_keep_signals`` gives child
  processes started while it is installed the handling the run's first children got.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Protocol

import torch
from filelock import FileLock, Timeout
from torchrl.checkpoint import GlobalRNGState

log = logging.getLogger("dreamer")
PREFIX = "checkpoint-"
REQUEUE_EXIT = 75  # EX_TEMPFAIL: checkpointed after SIGTERM/SIGUSR1/SIGUSR2; rerun to resume
INTERRUPT_EXIT = 130  # checkpointed after Ctrl-C
# Left in the run directory by rank 0 with REQUEUE_EXIT: torchrun reports any worker's
# non-zero code as 1, so a batch script learns of a checkpointed stop from this file.
STOPPED_FILE = "stopped"


def checkpoint_dir(logdir: Path) -> Path:
    return logdir / "checkpoints"


class CheckpointError(OSError):
    pass


def save(logdir: Path, step: int, state: dict, keep: int = 3) -> Path:
    """Write atomically; on failure (disk full, quota) the previous checkpoints stay
    intact, the partial file is removed and ``CheckpointError`` says why.

    Ours rather than torchrl's ``CheckpointRotation``: that one renames without fsync,
    so a power loss or kill -9 right after a save can leave neither checkpoint."""
    folder = checkpoint_dir(logdir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{PREFIX}{step:012d}.pt"
    temporary = folder / f".{final.name}.tmp"
    try:
        with temporary.open("wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
    except (OSError, RuntimeError) as error:  # torch.save wraps write errors in RuntimeError
        temporary.unlink(missing_ok=True)
        raise CheckpointError(f"checkpoint at step {step} not written: {error}") from None
    os.replace(temporary, final)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    for old in sorted(folder.glob(f"{PREFIX}*.pt"))[:-keep]:
        old.unlink()
    return final


def remove_partial(logdir: Path) -> list[Path]:
    """Delete temporary files of writes a crash interrupted; returns what it removed."""
    partial = sorted(checkpoint_dir(logdir).glob(f".{PREFIX}*.tmp"))
    for path in partial:
        path.unlink(missing_ok=True)
    return partial


def latest(logdir: Path) -> Path | None:
    found = sorted(checkpoint_dir(logdir).glob(f"{PREFIX}*.pt"))
    return found[-1] if found else None


def load(path: Path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=False)
    if "steps" not in state and "episodes" in state:
        # written before data-parallel runs, when the one rank's workers were the run's
        state["steps"] = {"env_steps": state["episodes"]["env_steps"]}
    return state


def find(path: str | Path) -> Path:
    """The checkpoint a user names: a file, or the latest in a run directory or in its
    ``checkpoints`` folder. ``CheckpointError`` (one line) when there is none."""
    path = Path(path)
    if path.is_dir():
        found = latest(path.parent if path.name == "checkpoints" else path)
        if found is None:
            raise CheckpointError(f"{path}: no checkpoint in it (expected {PREFIX}*.pt files)")
        return found
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file or run directory")
    return path


def load_checked(path: Path) -> dict:
    """``load``, with a file that is not a dreamer checkpoint refused in one line."""
    try:
        state = load(path)
    except Exception as error:  # torch.load raises many kinds on a foreign file
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"{path}: not a checkpoint ({detail[:120]})") from None
    if not isinstance(state, dict) or not {"learner", "config", "steps"} <= set(state):
        raise CheckpointError(f"{path}: not a dreamer checkpoint (no learner, config and steps)")
    return state


def latest_state(logdir: Path) -> dict | None:
    found = latest(logdir)
    return load(found) if found else None


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Registry:
    """Named stateful parts, saved and restored together."""

    def __init__(self):
        self.parts: dict[str, Stateful] = {}

    def register(self, name: str, part: Stateful) -> None:
        self.parts[name] = part

    def state_dict(self) -> dict:
        return {name: part.state_dict() for name, part in self.parts.items()}

    def load_state_dict(self, state: dict, names: tuple[str, ...] | None = None) -> None:
        """Restore every part, or only those in ``names``. A part newer than the
        checkpoint (``optional = True`` on it) keeps its initial state."""
        for name, part in self.parts.items():
            if name not in state and getattr(part, "optional", False):
                continue
            if names is None or name in names:
                part.load_state_dict(state[name])


class Saver:
    """Writes the registry's parts, and ``extras``, as the checkpoint of an env step;
    a failed write is logged and leaves the previous checkpoints as they were."""

    def __init__(self, logdir: Path, registry: Registry, extras: dict, keep: int):
        self.logdir, self.registry, self.extras, self.keep = logdir, registry, extras, keep

    def __call__(self, step: int) -> bool:
        state = self.registry.state_dict() | self.extras
        try:
            path = save(self.logdir, step, state, keep=self.keep)
        except CheckpointError as error:
            log.error("%s; the previous checkpoint is kept, retrying at the next interval", error)
            return False
        log.info("checkpoint written: %s", path)
        return True


class RngState(GlobalRNGState):
    """torchrl's process-wide RNG state (Python, NumPy, torch CPU and initialised
    accelerators); checkpoints written before it hold torch's CPU state alone."""

    def load_state_dict(self, state: dict) -> None:
        if "cpu" in state:
            torch.set_rng_state(state["cpu"])
            return
        if not torch.cuda.is_available():  # a GPU run resumed on a CPU
            state = {key: value for key, value in state.items() if key != "torch_cuda"}
        super().load_state_dict(state)


@contextlib.contextmanager
def rng_kept():
    """The process's RNG state as it was before the block, whatever the block drew."""
    rng = RngState()
    state = rng.state_dict()
    try:
        yield
    finally:
        rng.load_state_dict(state)


class RunLockedError(RuntimeError):
    pass


class RunLock:
    """Held for the whole run; a second process on the same directory is refused.

    The lock is an OS-level file lock, so the kernel releases it when the holder dies,
    even by SIGKILL: a stale lock file never blocks the next run.
    """

    def __init__(self, logdir: Path):
        self.path = logdir / "run.lock"
        self.owner = logdir / "run.lock.owner"
        self.lock = FileLock(self.path)

    def __enter__(self) -> RunLock:
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            holder = self.owner.read_text().strip() if self.owner.exists() else "unknown"
            raise RunLockedError(
                f"run.logdir: {self.path.parent} is in use by {holder}; "
                "stop that run or choose another run.logdir"
            ) from None
        self.owner.write_text(f"pid {os.getpid()} on {socket.gethostname()}\n")
        return self

    def __exit__(self, *exc) -> None:
        self.owner.unlink(missing_ok=True)
        self.lock.release()


class StopSignals:
    """Turns SIGTERM/SIGUSR1/SIGUSR2 into a flag the loop checks between updates
    (SLURM's preemption signal is USR1 in slurm/*.sbatch, USR2 from submitit)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    installed: StopSignals | None = None  # the one in effect in this process

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def __enter__(self) -> StopSignals:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        StopSignals.installed = self
        return self

    def __exit__(self, *exc) -> None:
        StopSignals.installed = None
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def ignored(self) -> list[int]:
        """The stop signals this process ignored before (slurm/node.sh ignores USR1)."""
        return [signum for signum, handler in self._previous.items() if handler == signal.SIG_IGN]


@contextlib.contextmanager
def children_keep_signals():
    """Processes started inside (a replaced collector, a relaunched evaluation process,
    a new render pool) ignore what the run's first children ignore.

    The first children start before ``StopSignals`` and inherit SIG_IGN for what the
    launcher ignores (USR1 under SLURM, which signals every process of the job step).
    Later ones would start with the default action (exec resets the handler), and a
    preemption would kill them before the checkpoint. Changing the disposition around a
    start would lose a signal arriving meanwhile, so these signals are blocked in the
    starting thread instead: the children (and their threads) inherit the blocked mask,
    so they never act on them, and this process takes a pending one when the mask is
    restored."""
    stop = StopSignals.installed
    blocked = stop.ignored() if stop is not None else []
    if not blocked:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
