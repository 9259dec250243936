"""A replay's files (``replay.directory``): what is on disk and how long each file lives.

A complete chunk is written once, atomically (``stream<i>/chunk-<first>.pt``); a checkpoint
writes each stream's tail (``tail-<end>.pt``). Nothing is overwritten, and a file goes once no
kept checkpoint and no live window reads it: a resume from any kept checkpoint, after a
kill -9 anywhere, finds its steps.

A chunk file's states (``ReplayFiles``' methods are the transitions):

  written     the file whole; the chunk in RAM (a disk replay's: a map of the file)
                -> ``evicted``: retained if a checkpoint reads it, else deleted
  unwritten   write failed: a memory replay's chunk in RAM only (a disk replay stops)
                -> ``save``: written, or that checkpoint fails; ``evicted``: dropped
  retained    out of RAM, the file kept for the checkpoints that read it
                -> ``after_checkpoint``: deleted once none of those is kept

Tails: written by ``save``, deleted by ``after_checkpoint``. Tests stop a run inside a
write with ``DREAMER_STOP_AT=replay_chunk_write`` or ``replay_tail_write``.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import torch

from dreamer.errors import first_line
from dreamer.outputs.logs import OutputError
from dreamer.runtime.checkpoint import CheckpointError
from dreamer.runtime.files import bytes_free, replacing
from dreamer.runtime.signals import stop_moment

log = logging.getLogger("dreamer")
CHUNK_FILE = re.compile(r"chunk-(\d+)\.pt")
TAIL_FILE = re.compile(r"tail-(\d+)\.pt")
FORMAT1_CURSORS = "written.npy"  # a format-1 disk replay's cursors (``replay_format1``)

Chunk = dict[str, torch.Tensor]  # a chunk's rows, by field name


def stream_dir(directory: Path, stream: int) -> Path:
    return directory / f"stream{stream}"


def chunk_path(directory: Path, stream: int, first: int) -> Path:
    return stream_dir(directory, stream) / f"chunk-{first:012d}.pt"


def tail_path(directory: Path, stream: int, end: int) -> Path:
    return stream_dir(directory, stream) / f"tail-{end:012d}.pt"


def reads(entry: dict, stream: int, per_stream: int, chunk: int) -> tuple[range, int | None]:
    """(chunk first rows, tail end or None) that ``stream`` of a checkpoint's counters reads."""
    written, floor = int(entry["written"][stream]), int(entry["floor"][stream])
    oldest = max(written - per_stream, floor, 0)
    if oldest >= written:
        return range(0), None
    complete = written - written % chunk
    tail = written if written % chunk else None
    return range(oldest - oldest % chunk, complete, chunk), tail


def tail_rows(chunks: dict[int, Chunk], end: int, chunk: int) -> tuple[int, Chunk]:
    """The first row of the incomplete chunk that ends at ``end``, and a copy of its rows."""
    first = end - end % chunk
    return first, {name: value[: end - first].clone() for name, value in chunks[first].items()}


def write_file(path: Path, first: int, data: Chunk) -> None:
    """One replay file, whole or not at all; ``OSError`` (ENOSPC) when it fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as handle:
        try:  # straight to the file: no copy of the chunk in between
            torch.save({"first": first, "data": data}, handle)
        except RuntimeError as error:  # torch's writer wraps the file's OSError
            if isinstance(error.__context__, OSError):
                raise error.__context__ from None
            raise
        stop_moment(f"replay_{path.name.split('-')[0]}_write")


def write_error(path: Path, error: OSError) -> str:
    return f"replay: {path}: {error.strerror or error}{bytes_free(path.parent)}"


def read_file(path: Path, first: int, fields: list, chunk: int, mapped: bool) -> Chunk:
    """A replay file's rows, checked against ``fields``; ``mapped``: through a memory map
    of the file (else read into RAM). A missing or cut file: one ``CheckpointError``."""
    advice = (
        "a resume reads the replay files its checkpoint names: keep the run "
        "directory whole (or start a new run from its weights: run.from_checkpoint)"
    )
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; {advice}")
    try:
        content = torch.load(path, map_location="cpu", weights_only=True, mmap=mapped)
        data = content["data"]
        assert content["first"] == first
        for field in fields:
            value = data[field.name]
            assert value.dtype == field.stored_dtype, field.name
            assert tuple(value.shape[1:]) == field.stored_shape, field.name
            assert 0 < value.shape[0] <= chunk
    except Exception as error:  # torch.load raises many kinds on a cut file
        raise CheckpointError(
            f"{path}: not a whole replay file ({first_line(error)}); {advice}"
        ) from None
    return data


class Checkpoints:
    """Replay counters, by env step, of the checkpoints on disk and of one being written."""

    def __init__(self, kept: dict[int, dict] | None = None):
        self.kept: dict[int, dict] = kept or {}
        self.pending: tuple[int, dict] | None = None
        self.saving = -1

    def entries(self) -> list[dict]:
        return [*self.kept.values(), *([self.pending[1]] if self.pending else [])]

    def settle(self, steps: list[int]) -> int | None:
        """A write is over and ``steps`` are on disk; returns the step just saved if kept."""
        saved = None
        if self.pending is not None:
            (step, entry), self.pending = self.pending, None
            if step in steps:
                self.kept[step], saved = entry, step
        self.kept = {step: entry for step, entry in self.kept.items() if step in steps}
        return saved


class ReplayFiles:
    """The files of a replay that writes them (the module docstring has their states)."""

    def __init__(self, directory: Path, streams: int, per_stream: int, chunk: int, disk: bool):
        self.directory, self.streams = directory, streams
        self.per_stream, self.chunk = per_stream, chunk
        self.disk = disk  # its written chunks are read through maps: none stays unwritten
        self.unwritten: list[set[int]] = [set() for _ in range(streams)]  # first rows
        self.tails: list[set[int]] = [set() for _ in range(streams)]  # ends on disk
        self.checkpoints = Checkpoints()
        # the folder holds only this run's files (an earlier start's go at the first write)
        self.claimed = False
        # a converted format-1 ring is kept until every kept checkpoint is >= format1_until
        self.format1_ring = False
        self.format1_until: int | None = None
        self.warned = False

    # ------------------------------------------------------------------ a run's start

    def start_fresh(self) -> None:
        """The first write of a run that resumed nothing: an earlier start's files go."""
        self.claimed = True
        for stream in range(self.streams):
            shutil.rmtree(stream_dir(self.directory, stream), ignore_errors=True)
        (self.directory / FORMAT1_CURSORS).unlink(missing_ok=True)

    def loaded(self, state: dict) -> None:
        """A checkpoint's replay was read: its tails and index (if it has one) are ours."""
        self.claimed = True
        self.chunk = int(state["chunk"])
        self.unwritten = [set() for _ in range(self.streams)]
        self.tails = [set() for _ in range(self.streams)]
        if "kept" not in state:
            return
        for stream in range(self.streams):
            tail = reads(state, stream, self.per_stream, self.chunk)[1]
            if tail is not None:
                self.tails[stream].add(tail)
        self.checkpoints = Checkpoints({int(step): kept for step, kept in state["kept"].items()})
        self.format1_ring = bool(state.get("legacy_files"))
        self.format1_until = state.get("legacy_before")

    def converted(self, ring: bool) -> None:
        """A format-1 replay was converted; ``ring``: it has a disk ring to keep."""
        self.claimed = True
        self.format1_ring = ring

    # ------------------------------------------------------------------ as chunks fill

    def completed(self, stream: int, first: int, data: Chunk) -> bool:
        """A chunk just filled: written now; False where that failed (kept unwritten)."""
        path = chunk_path(self.directory, stream, first)
        try:
            write_file(path, first, data)
        except OSError as error:
            message = write_error(path, error)
            if self.disk:
                raise OutputError(message) from None
            path.unlink(missing_ok=True)  # a file of an earlier start, not of these steps
            self.unwritten[stream].add(first)
            if not self.warned:
                self.warned = True
                log.warning("%s; kept in memory, written with the next checkpoint", message)
            return False
        return True

    def evicted(self, stream: int, firsts: list[int]) -> None:
        """Chunks the ring passed: their files go unless a kept checkpoint reads them."""
        needed = self._needed(stream)[0]
        for first in firsts:
            self.unwritten[stream].discard(first)
            if first not in needed:
                chunk_path(self.directory, stream, first).unlink(missing_ok=True)

    # ------------------------------------------------------------------ checkpoints

    def before_checkpoint(self, step: int) -> None:
        self.checkpoints.saving = step

    def save(self, entry: dict, chunks: list[dict[int, Chunk]]) -> dict:
        """Writes the unwritten chunks and tails the checkpoint of counters ``entry`` reads
        (``CheckpointError`` on failure); returns the index its state holds."""
        for stream in range(self.streams):
            for first in sorted(self.unwritten[stream]):
                path = chunk_path(self.directory, stream, first)
                self._write_for_checkpoint(path, first, chunks[stream][first])
                self.unwritten[stream].discard(first)
            tail = reads(entry, stream, self.per_stream, self.chunk)[1]
            if tail is not None and tail not in self.tails[stream]:
                first, data = tail_rows(chunks[stream], tail, self.chunk)
                self._write_for_checkpoint(tail_path(self.directory, stream, tail), first, data)
                self.tails[stream].add(tail)
        self.checkpoints.pending = (self.checkpoints.saving, entry)
        return {
            "kept": dict(self.checkpoints.kept) | {self.checkpoints.saving: entry},
            "legacy_files": self.format1_ring,
            "legacy_before": self.format1_until,
        }

    def _write_for_checkpoint(self, path: Path, first: int, data: Chunk) -> None:
        try:
            write_file(path, first, data)
        except OSError as error:
            saving = self.checkpoints.saving
            step = f" at step {saving}" if saving >= 0 else ""
            message = f"checkpoint{step} not written: {write_error(path, error)}"
            raise CheckpointError(message) from None

    def after_checkpoint(self, steps: list[int], live: dict) -> None:
        """Deletes the files neither the checkpoints on disk (``steps``) nor ``live`` read."""
        saved = self.checkpoints.settle(steps)
        if self.format1_ring and self.format1_until is None:
            self.format1_until = saved
        if self.format1_until is not None and all(s >= self.format1_until for s in steps):
            self._remove_format1_ring()
        for stream in range(self.streams):
            chunks, tails = self._needed(stream, live)
            folder = stream_dir(self.directory, stream)
            for path in folder.iterdir() if folder.is_dir() else ():
                name = path.name
                if (found := CHUNK_FILE.fullmatch(name)) and int(found[1]) not in chunks:
                    path.unlink(missing_ok=True)
                elif (found := TAIL_FILE.fullmatch(name)) and int(found[1]) not in tails:
                    path.unlink(missing_ok=True)
                    self.tails[stream].discard(int(found[1]))
                elif name.startswith(".") and name.endswith(".tmp"):  # a crash's leftover
                    path.unlink(missing_ok=True)

    def _needed(self, stream: int, live: dict | None = None) -> tuple[set[int], set[int]]:
        """(chunks, tails) of ``stream`` the kept, saving and ``live`` counters read."""
        chunks, tails = set(), set()
        for entry in self.checkpoints.entries():
            firsts, tail = reads(entry, stream, self.per_stream, self.chunk)
            chunks.update(firsts)
            if tail is not None:
                tails.add(tail)
        if live is not None:
            chunks.update(reads(live, stream, self.per_stream, self.chunk)[0])
        return chunks, tails

    def _remove_format1_ring(self) -> None:
        """The format-1 ring, once no checkpoint on disk reads it."""
        self.format1_ring, self.format1_until = False, None
        (self.directory / FORMAT1_CURSORS).unlink(missing_ok=True)
        for stream in range(self.streams):
            folder = stream_dir(self.directory, stream)
            for path in folder.iterdir() if folder.is_dir() else ():
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                elif not (CHUNK_FILE.fullmatch(path.name) or TAIL_FILE.fullmatch(path.name)):
                    path.unlink(missing_ok=True)
        log.info("replay: removed the format-1 replay files (no checkpoint reads them now)")
