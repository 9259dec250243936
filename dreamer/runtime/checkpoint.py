"""Checkpoints written atomically with a SHA-256 of their content, loaded ``weights_only`` (a
shared file runs no code), and the ``Registry`` of stateful parts, saved or restored in one
call (a part may define ``before_checkpoint(step)`` and ``after_checkpoint(steps on disk)``)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import pickle
import re
from pathlib import Path
from typing import Protocol

import torch
from torchrl.checkpoint import GlobalRNGState

from dreamer.errors import first_line
from dreamer.runtime.files import bytes_free, replacing, temporary_of
from dreamer.runtime.rotation import (
    PREFIX,
    CheckpointError,
    checkpoint_dir,
    latest,
    rotation,
    saved_steps,
)
from dreamer.runtime.signals import stop_moment

log = logging.getLogger("dreamer")
# Format 2: the replay's contents are files under <run.logdir>/replay, indexed here;
# 1 (converted by the replay): its contents inside, or its ring of memory-mapped files.
FORMAT = 2
READS = (1, 2)
DAMAGED_SUFFIX = ".damaged"  # a checkpoint a resume found damaged, kept for inspection


class UnsafeCheckpointError(CheckpointError):
    """Loading the file would build objects other than tensors and plain containers."""


def save(logdir: Path, step: int, state: dict, keep: int = 3) -> Path:
    """Write atomically with an fsync (torchrl's ``CheckpointRotation`` has none: a power loss
    can leave neither checkpoint); on failure the older ones stay, ``CheckpointError`` says why."""
    folder = checkpoint_dir(logdir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{PREFIX}{step:012d}.pt"
    content = {"format": FORMAT, **state}
    content["checksum"] = checksum(content)
    try:
        with replacing(final) as handle:
            torch.save(content, handle)
            stop_moment("checkpoint_write")
    except (OSError, RuntimeError) as error:  # torch.save wraps write errors in RuntimeError
        raise CheckpointError(  # torch's message may not say the disk is full: the bytes do
            f"checkpoint at step {step} not written: {_detail(error)}{bytes_free(folder)}"
        ) from None
    for old in rotation(logdir)[:-keep]:
        old.unlink()
    return final


def remove_partial(logdir: Path) -> list[Path]:
    """Delete temporary files of writes a crash interrupted; returns what it removed."""
    partial = sorted(checkpoint_dir(logdir).glob(temporary_of(Path(f"{PREFIX}*.pt")).name))
    for path in partial:
        path.unlink(missing_ok=True)
    return partial


def checksum(state: dict) -> str:
    """SHA-256 of a checkpoint's content: every key, plain value and tensor (dtype,
    shape and bytes), in order, its own ``checksum`` entry left out."""
    digest = hashlib.sha256()

    def feed(value) -> None:
        if isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"tensor {flat.dtype} {tuple(value.shape)};".encode())
            digest.update(flat.view(torch.uint8).numpy().data if flat.numel() else b"")
        elif isinstance(value, dict):
            items = [(k, v) for k, v in value.items() if value is not state or k != "checksum"]
            digest.update(f"dict {len(items)};".encode())
            for key, item in items:
                feed(key)
                feed(item)
        elif isinstance(value, (list, tuple)):
            digest.update(f"{type(value).__name__} {len(value)};".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"{type(value).__name__} {value!r};".encode())

    feed(state)
    return digest.hexdigest()


def load(path: Path) -> dict:
    """The checkpoint's content; ``CheckpointError`` naming the file for one not whole, of
    another format, or that would build anything but tensors and plain containers."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many kinds on a foreign or cut file
        # torch's weights-only unpickler names what it would have imported and called
        unsafe = isinstance(error, pickle.UnpicklingError) and re.search(
            r"GLOBAL ([\w.]+)", str(error)
        )
        if unsafe:
            reason = f"refused: loading it would run code (it calls {unsafe[1]})"
            raise UnsafeCheckpointError(f"{path}: {reason}", reason) from None
        reason = f"not a readable checkpoint ({_detail(error)})"
        raise CheckpointError(f"{path}: {reason}", reason) from None
    if not isinstance(state, dict) or not {"learner", "config", "steps"} <= set(state):
        reason = "not a dreamer checkpoint (no learner, config and steps)"
    elif state.get("format") not in READS:
        formats = " and ".join(map(str, READS))
        reason = f"checkpoint format {state.get('format')}; this dreamer reads formats {formats}"
    elif state.get("checksum") != checksum(state):
        reason = "damaged: its content does not match its checksum"
    else:
        return state
    raise CheckpointError(f"{path}: {reason}", reason)


def _detail(error: Exception) -> str:
    """The line of a load error that says what is wrong (not torch's advice around it)."""
    advice = ("Weights only", "(1)", "(2)", "Check the doc", "Please file", "WeightsUnp")
    return first_line(error, advice)


def newest_good(logdir: Path) -> tuple[Path, dict] | tuple[None, None]:
    """The newest checkpoint that loads whole, and its state; newer damaged ones are
    renamed ``*.damaged``, and one that would run code raises ``UnsafeCheckpointError``."""
    skipped: list[tuple[Path, CheckpointError]] = []
    for path in reversed(rotation(logdir)):
        try:
            state = load(path)
        except UnsafeCheckpointError:
            raise
        except CheckpointError as error:
            skipped.append((path, error))
            continue
        for bad, error in skipped:
            bad.rename(bad.with_name(bad.name + DAMAGED_SUFFIX))
            log.warning("skipped %s (%s): resuming from %s", bad.name, error.reason, path.name)
        return path, state
    if skipped:
        raise CheckpointError(f"no checkpoint of {logdir} loads: {skipped[0][1]}")
    return None, None


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
        """Restore every part, or only those in ``names``."""
        for name, part in self.parts.items():
            if names is None or name in names:
                part.load_state_dict(state[name])

    def notify(self, hook: str, *args) -> None:
        """Call ``hook(*args)`` of every part that has one."""
        for part in self.parts.values():
            if (method := getattr(part, hook, None)) is not None:
                method(*args)


class Saver:
    """Writes the registry's parts and ``extras`` as an env step's checkpoint; a failed
    write is logged, and ``failures`` in a row raise ``SaveFailures``."""

    def __init__(self, logdir: Path, registry: Registry, extras: dict, keep: int, failures: int):
        self.logdir, self.registry, self.extras, self.keep = logdir, registry, extras, keep
        self.failures, self.failed = failures, 0  # allowed in a row, failed in a row

    def final(self, step: int) -> bool:
        """The checkpoint at the end of a run: a failure is logged, never raised."""
        try:
            return self(step)
        except SaveFailures:
            return False

    def __call__(self, step: int) -> bool:
        self.registry.notify("before_checkpoint", step)
        try:  # a part's own files (the replay's tails) are part of the write
            state = self.registry.state_dict() | self.extras
            path = save(self.logdir, step, state, keep=self.keep)
        except CheckpointError as error:
            self.failed += 1
            log.error("%s; the previous checkpoint is kept, retrying at the next interval", error)
            if self.failed >= self.failures:
                last = latest(self.logdir)
                raise SaveFailures(
                    f"{self.failed} checkpoint writes in a row failed (last: {error}); "
                    f"a rerun resumes from {last.name if last else 'the start'}"
                ) from None
            return False
        self.failed = 0
        log.info("checkpoint written: %s", path)
        self.registry.notify("after_checkpoint", saved_steps(self.logdir))
        return True


class SaveFailures(OSError):
    """``run.save_failures`` failed writes in a row: exit 1 (not a ``CheckpointError``: 2)."""


class RngState(GlobalRNGState):
    """torchrl's process-wide RNG state (Python, NumPy, torch CPU and initialised
    accelerators); a GPU run's checkpoint resumes on a CPU without its CUDA state."""

    def load_state_dict(self, state: dict) -> None:
        if not torch.cuda.is_available():
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
