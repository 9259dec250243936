"""Replay: one stream per env worker, sampled as windows of consecutive steps.

The sampling is ours: the collector delivers interleaved chunks from many workers, and
a DreamerV3 sequence must be ``length`` consecutive steps of ONE worker's stream
(episode starts inside it are marked by ``is_init``, where the RSSM resets). torchrl's
``SliceSampler`` cuts trajectories by contiguous storage, which chunk interleaving
breaks, and it cannot exclude windows that straddle a stream's write cursor.

The storage is ours too. torchrl's ``LazyTensorStorage`` and ``LazyMemmapStorage``
allocate the whole capacity at their first write (Crafter at the default
``replay.size``: 12 GB of RAM or of disk from the first transition) and a checkpoint
of one holds all of it, each time: that is the gap. Here each stream is a run of
fixed-size chunks (``CHUNK`` rows; a stream's whole capacity if that is less),
addressed by absolute time (the stream's ``written`` count), allocated as the stream
fills and dropped once the ring has passed them, so RAM and disk follow the fill.

Persistence (with a ``directory``): a chunk, once complete, is written once,
atomically (temporary file, fsync, rename), as ``stream<i>/chunk-<start>.pt``; a
checkpoint writes only each stream's incomplete tail (``tail-<end>.pt``, under a chunk)
and holds an index: the counters, the sampling generator and what each checkpoint on
disk needs. A file is deleted once no kept checkpoint and no live window needs it:
nothing is overwritten in place, so a resume from any kept checkpoint, after a kill -9
anywhere, finds exactly its steps (the same digest, the same next sample).
``storage="disk"`` reads completed chunks through a memory map of their files
(resident memory stays flat); ``memory`` keeps them in RAM. Completed chunks are
written as they complete in both (a save then writes tails only, under a chunk per
stream, whatever the fill); a memory replay whose chunk write fails keeps it and
retries at the next checkpoint (whose failure counts as a failed checkpoint write); a
disk replay cannot keep it, and stops the run with one ``OutputError`` line.

Compact: a one-hot action (MineDojo's several heads: one-hot each) is stored as one
index per head (uint8 up to 256 choices) and decoded at sample to the dtype and shape
it came in; images stay uint8; only ``replay_keys`` are stored, once.

Checkpoint format 1 held torchrl storages (memory: their contents; disk: a ring of
memory-mapped files and ``written.npy``); ``load_state_dict`` converts both.

Test hooks (environment): ``DREAMER_REPLAY_DEBUG=1`` logs the digest and generator at
every checkpoint and resume; ``DREAMER_REPLAY_WRITE_DELAY=<s>`` holds every replay file
write that long before its fsync and rename (a window to kill it in).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch.nn import functional

from dreamer.errors import ConfigError
from dreamer.outputs.logs import OutputError
from dreamer.runtime.checkpoint import CheckpointError
from dreamer.runtime.files import replacing

log = logging.getLogger("dreamer")
ENV_INDEX = "env_index"
ACTION = "action"
CHUNK = 1024  # rows per chunk (Crafter: 12.6 MB)
LAYOUT = 2  # of the replay's state: chunk files and an index (1: torchrl storages)
CHUNK_FILE = re.compile(r"chunk-(\d+)\.pt")
TAIL_FILE = re.compile(r"tail-(\d+)\.pt")
LEGACY_CURSORS = "written.npy"  # a format-1 disk replay's cursors
DEBUG = bool(os.environ.get("DREAMER_REPLAY_DEBUG"))  # test hooks: the module docstring
WRITE_DELAY = float(os.environ.get("DREAMER_REPLAY_WRITE_DELAY") or 0)
SPARE = 2  # RAM chunks kept for reuse


def replay_keys(obs_names: list[str]) -> list:
    """The entries one DreamerV3 update reads; nothing else is stored. No latent: the
    world model starts every window from zeros (``ZeroStartRollout``)."""
    return [
        ACTION,
        "is_init",
        *[("next", name) for name in obs_names],
        ("next", "reward"),
        ("next", "done"),
        ("next", "terminated"),
    ]


def action_heads(spaces) -> tuple[int, ...]:
    """The one-hot heads of a discrete action layout (one for a flat one), else ()."""
    if not spaces.discrete:
        return ()
    return tuple(head.size for head in spaces.action_heads) or (spaces.action_dim,)


def row_bytes(spaces) -> int:
    """About the bytes one stored transition takes (images uint8, vectors float32,
    actions as indices or float32, is_init, reward, done, terminated)."""
    obs = sum(key.size * (1 if key.kind == "image" else 4) for key in spaces.obs)
    heads = action_heads(spaces)
    action = len(heads) * _index_dtype(heads).itemsize if heads else spaces.action_dim * 4
    return obs + action + 1 + 4 + 1 + 1


def _index_dtype(heads: tuple[int, ...]) -> torch.dtype:
    largest = max(heads)
    return torch.uint8 if largest <= 256 else torch.int16 if largest <= 32768 else torch.int32


def random_batch(spaces, batch: int, length: int, seed: int = 0) -> TensorDict:
    """A [batch, length] sample of random data in the layout ``SequenceReplay.sample``
    gives for ``spaces`` (keys, dtypes, shapes): for timing an update before any data
    exists, and for learners whose envs cannot run here. ~5% of steps end an episode."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, length)
    nxt = {}
    for key in spaces.obs:
        if key.kind == "image":
            nxt[key.name] = torch.randint(0, 256, (*shape, *key.shape), generator=g).byte()
        else:
            nxt[key.name] = torch.randn(*shape, *key.shape, generator=g)
    if heads := action_heads(spaces):
        parts = [torch.randint(0, n, shape, generator=g) for n in heads]
        action = torch.cat([functional.one_hot(p, n) for p, n in zip(parts, heads)], -1)
    else:
        action = torch.rand(*shape, spaces.action_dim, generator=g) * 2 - 1
    done = torch.rand(*shape, 1, generator=g) < 0.05
    nxt.update(
        reward=torch.randn(*shape, 1, generator=g),
        done=done,
        terminated=done & (torch.rand(*shape, 1, generator=g) < 0.5),
    )
    is_init = torch.zeros(*shape, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[:, 1:] = done[:, :-1]
    return TensorDict({ACTION: action, "is_init": is_init, "next": TensorDict(nxt, shape)}, shape)


@dataclass(frozen=True)
class Field:
    """One stored entry: its key, and a row's dtype and shape as collected (and as
    sampled). ``heads``: a one-hot action stored as one index per head."""

    key: str | tuple[str, ...]
    dtype: torch.dtype
    shape: tuple[int, ...]
    heads: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return "/".join(self.key) if isinstance(self.key, tuple) else self.key

    @property
    def stored_dtype(self) -> torch.dtype:
        return _index_dtype(self.heads) if self.heads else self.dtype

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return (len(self.heads),) if self.heads else self.shape

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.stored_shape, dtype=np.int64)) * self.stored_dtype.itemsize

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        if not self.heads:
            return values
        parts = values.split(self.heads, -1)
        stored = torch.stack([part.argmax(-1) for part in parts], -1).to(self.stored_dtype)
        if not torch.equal(self.decode(stored), values.to(self.dtype)):
            raise ValueError(
                f"replay: {self.name} is not one-hot in each of its heads {list(self.heads)}"
            )
        return stored

    def decode(self, stored: torch.Tensor) -> torch.Tensor:
        if not self.heads:
            return stored
        hot = [functional.one_hot(stored[..., i].long(), n) for i, n in enumerate(self.heads)]
        return torch.cat(hot, -1).to(self.dtype)

    def to_state(self) -> dict:
        key = list(self.key) if isinstance(self.key, tuple) else [self.key]
        dtype = str(self.dtype).removeprefix("torch.")
        return {"key": key, "dtype": dtype, "shape": list(self.shape), "heads": list(self.heads)}

    @classmethod
    def from_state(cls, state: dict) -> Field:
        key = tuple(state["key"]) if len(state["key"]) > 1 else state["key"][0]
        dtype = getattr(torch, state["dtype"])
        return cls(key, dtype, tuple(state["shape"]), tuple(state["heads"]))


class SequenceReplay:
    @classmethod
    def from_config(
        cls,
        cfg,
        obs_names: list[str],
        logdir: Path,
        rank: int = 0,
        ranks: int = 1,
        heads: tuple[int, ...] = (),
        readonly: bool = False,
    ) -> SequenceReplay:
        """The run's replay as ``replay.*`` and ``run.envs`` describe it; with several
        ranks, this rank's shard: its share of the capacity, of the streams (its env
        workers) and of the batch. ``heads``: the one-hot action heads
        (``action_heads``); ``readonly``: a checkpoint's replay read, never written
        (``dreamer.evaluate``). Only rank 0 checkpoints, so only its memory replay
        writes files."""
        directory = logdir / "replay"
        return cls(
            cfg.replay.size // ranks,
            cfg.run.envs // ranks,
            cfg.replay.batch // ranks,
            cfg.replay.length,
            replay_keys(obs_names),
            seed=cfg.run.seed + rank,
            storage=cfg.replay.storage,
            directory=directory / f"rank{rank}" if ranks > 1 else directory,
            heads=heads,
            persist=rank == 0,
            readonly=readonly,
        )

    def __init__(
        self,
        capacity: int,
        streams: int,
        batch: int,
        length: int,
        keys: list,
        seed: int = 0,
        storage: str = "memory",
        directory: Path | None = None,
        heads: tuple[int, ...] = (),
        chunk: int = CHUNK,
        persist: bool = True,
        readonly: bool = False,
    ):
        self.per_stream = max(capacity // streams, length)
        self.chunk = min(chunk, self.per_stream)
        self.streams = streams
        self.batch = batch
        self.length = length
        self.keys = keys
        self.heads = tuple(heads)
        self.disk = storage == "disk"
        if self.disk and directory is None:
            raise ValueError("a disk replay needs a directory")
        self.directory = Path(directory) if directory is not None else None
        # files: chunks are written (to be checkpointed, or mapped); readonly: never
        self.writes = self.directory is not None and (persist or self.disk) and not readonly
        self.readonly = readonly
        # written[i]: transitions ever written to stream i (its write cursor in time)
        self.written = torch.zeros(streams, dtype=torch.long)
        # floor[i]: the oldest step of stream i still intact (only a converted format-1
        # disk replay has one above 0: its ring was overwritten past its checkpoint)
        self.floor = torch.zeros(streams, dtype=torch.long)
        self.generator = torch.Generator().manual_seed(seed)
        self.fields: list[Field] | None = None  # learned from the first write, or loaded
        self.chunks: list[dict[int, dict[str, torch.Tensor]]] = [{} for _ in range(streams)]
        self.unsaved: list[set[int]] = [set() for _ in range(streams)]  # failed writes
        self.tails: list[set[int]] = [set() for _ in range(streams)]  # tail files written
        # the checkpoints on disk (env step -> written, floor) and the one being saved
        self.kept: dict[int, dict] = {}
        self.pending: tuple[int, dict] | None = None
        self.saving: int = -1  # the env step of the checkpoint being saved
        self.started = False  # written to or loaded: files of an earlier start are gone
        self.legacy_files = False  # a converted format-1 disk replay's ring is still kept
        self.legacy_before: int | None = None  # the first checkpoint of the new layout
        self.warned = False
        self.spare: list[dict[str, torch.Tensor]] = []  # RAM chunks to reuse

    # ------------------------------------------------------------------ sizes, room

    @property
    def row_bytes(self) -> int:
        """Stored bytes per transition (0 before the first write)."""
        return sum(field.row_bytes for field in self.fields or ())

    def allocated_bytes(self) -> int:
        """Bytes the chunks in memory hold (a disk replay's mapped ones included)."""
        return sum(
            tensor.numel() * tensor.element_size()
            for stream in self.chunks
            for chunk in stream.values()
            for tensor in chunk.values()
        )

    def check_room(self, transitions: int, per_row: int) -> None:
        """Log what ``transitions`` (this replay's share of the run, capped at its
        capacity) will need, in RAM and on disk; ``ConfigError`` (one line) where the
        machine cannot hold it: more than its RAM for a memory replay, more than the
        free disk (plus the replay's own files, reused) where chunks are written."""
        rows = min(transitions, self.per_stream * self.streams)
        need = rows * per_row
        ram = memory_limit()
        where = "in memory-mapped files" if self.disk else "in RAM"
        free = None
        if self.writes:
            self.directory.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.directory).free + _bytes_under(self.directory)
        on_disk = f", {_gb(free)} free for it under {self.directory}" if free is not None else ""
        log.info(
            "replay: up to %s transitions of about %s B: %s %s (this machine: %s RAM%s)",
            f"{rows:,}",
            f"{per_row:,}",
            _gb(need),
            where + (" and as files" if self.writes and not self.disk else ""),
            _gb(ram),
            on_disk,
        )
        if not self.disk and need > ram:
            raise ConfigError(
                f"replay.size: {rows:,} transitions of about {per_row:,} B need {_gb(need)}"
                f" of RAM with replay.storage=memory and this machine has {_gb(ram)};"
                " lower replay.size or set replay.storage=disk"
            )
        if free is not None and need > free:
            raise ConfigError(
                f"replay.size: {rows:,} transitions of about {per_row:,} B need {_gb(need)}"
                f" on disk under {self.directory} and {_gb(free)} is free there;"
                " lower replay.size or free some space"
            )

    # ------------------------------------------------------------------ writing

    def _oldest(self) -> torch.Tensor:
        return torch.maximum(self.written - self.per_stream, self.floor).clamp(min=0)

    def __len__(self) -> int:
        return int((self.written - self._oldest()).sum())

    def extend(self, data: TensorDictBase) -> None:
        """Append a batch of transitions routed by their ``env_index`` entry."""
        data = data.reshape(-1)
        env_index = data.get(ENV_INDEX).reshape(-1)
        if not self.started:
            self._start_fresh()
        if self.fields is None:
            self.fields = self._learn(data)
        values = {field.name: field.encode(data.get(field.key)) for field in self.fields}
        for stream in env_index.unique().tolist():
            mine = env_index == stream
            self._append(stream, {name: value[mine] for name, value in values.items()})

    def _learn(self, data: TensorDictBase) -> list[Field]:
        fields = []
        for key in self.keys:
            value = data.get(key)
            field = Field(key, value.dtype, tuple(value.shape[1:]))
            if key == ACTION and self.heads and field.shape == (sum(self.heads),):
                coded = replace(field, heads=self.heads)
                with contextlib.suppress(ValueError):  # not one-hot: stored as it is
                    coded.encode(value)
                    field = coded
            fields.append(field)
        return fields

    def _append(self, stream: int, rows: dict[str, torch.Tensor]) -> None:
        count = next(iter(rows.values())).shape[0]
        start = int(self.written[stream])
        end = start + count
        chunk = self.chunk
        at = max(start, end - self.per_stream)  # older rows would be dropped at once
        completed = []
        while at < end:
            first = at - at % chunk
            if first not in self.chunks[stream]:
                self.chunks[stream][first] = self._new_chunk()
            target = self.chunks[stream][first]
            take = min(end, first + chunk) - at
            for name, value in rows.items():
                target[name][at - first : at - first + take] = value[at - start : at - start + take]
            at += take
            if at == first + chunk:
                completed.append(first)
        self.written[stream] = end
        for first in completed:
            self._completed(stream, first)
        self._evict(stream)

    def _new_chunk(self) -> dict[str, torch.Tensor]:
        if self.spare:  # a chunk's buffers nothing reads any more, zeroed
            chunk = self.spare.pop()
            for tensor in chunk.values():
                tensor.zero_()
            return chunk
        return {
            field.name: torch.zeros((self.chunk, *field.stored_shape), dtype=field.stored_dtype)
            for field in self.fields
        }

    def _recycle(self, chunk: dict[str, torch.Tensor]) -> None:
        """Keep a chunk's RAM for the next one: freed and allocated again, chunk after
        chunk, the allocator's heap would fragment and hold on to what it freed (a
        disk replay's resident memory grew by half the data that way)."""
        if len(self.spare) < SPARE:
            self.spare.append(chunk)

    def _stream_dir(self, stream: int) -> Path:
        return self.directory / f"stream{stream}"

    def _chunk_path(self, stream: int, first: int) -> Path:
        return self._stream_dir(stream) / f"chunk-{first:012d}.pt"

    def _tail_path(self, stream: int, end: int) -> Path:
        return self._stream_dir(stream) / f"tail-{end:012d}.pt"

    def _completed(self, stream: int, first: int) -> None:
        """A chunk just filled: written once, now (a disk replay then maps it)."""
        if not self.writes:
            return
        path = self._chunk_path(stream, first)
        try:
            self._write(path, first, self.chunks[stream][first])
        except OSError as error:
            message = self._write_error(path, error)
            if self.disk:
                raise OutputError(message) from None
            path.unlink(missing_ok=True)  # a file of an earlier start, not of these steps
            self.unsaved[stream].add(first)
            if not self.warned:
                self.warned = True
                log.warning("%s; kept in memory, written with the next checkpoint", message)
            return
        if self.disk:
            self._recycle(self.chunks[stream][first])
            self.chunks[stream][first] = self._read(path, first, mapped=True)
        release_freed_memory()  # once a chunk: what the chunk's writes freed

    def _write(self, path: Path, first: int, data: dict[str, torch.Tensor]) -> None:
        """One replay file, whole or not at all; ``OSError`` (ENOSPC) when it fails."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path) as handle:
            try:  # straight to the file: no copy of the chunk in between
                torch.save({"first": first, "data": data}, handle)
            except RuntimeError as error:  # torch's writer wraps the file's OSError
                if isinstance(error.__context__, OSError):
                    raise error.__context__ from None
                raise
            if WRITE_DELAY:
                time.sleep(WRITE_DELAY)

    def _write_error(self, path: Path, error: OSError) -> str:
        with contextlib.suppress(OSError):
            free = shutil.disk_usage(path.parent).free
            return f"replay: {path}: {error.strerror or error} ({free:,} bytes free)"
        return f"replay: {path}: {error.strerror or error}"

    def _evict(self, stream: int) -> None:
        """Drop the chunks the ring has passed; their files go too unless a kept
        checkpoint still needs them (``after_checkpoint`` removes those later)."""
        oldest = int(self._oldest()[stream])
        passed = [first for first in self.chunks[stream] if first + self.chunk <= oldest]
        if not passed:
            return
        needed = self._needed(stream, live=False)[0] if self.writes else set()
        for first in passed:
            chunk = self.chunks[stream].pop(first)
            if self.writes and not self.disk:  # (a state without files holds chunks)
                self._recycle(chunk)
            self.unsaved[stream].discard(first)
            if self.writes and first not in needed:
                self._chunk_path(stream, first).unlink(missing_ok=True)

    def _start_fresh(self) -> None:
        """The first write of a run that resumed nothing: what an earlier start left in
        the folder (a run killed before its first checkpoint) goes."""
        self.started = True
        if not self.writes:
            return
        for stream in range(self.streams):
            shutil.rmtree(self._stream_dir(stream), ignore_errors=True)
        (self.directory / LEGACY_CURSORS).unlink(missing_ok=True)

    # ------------------------------------------------------------------ sampling

    def _window_counts(self) -> torch.Tensor:
        stored = self.written - self._oldest()
        return (stored - self.length + 1).clamp(min=0)

    def can_sample(self) -> bool:
        return bool(self._window_counts().sum() > 0)

    def sample(self) -> TensorDict:
        """``batch`` windows of ``length`` steps, shape [batch, length]."""
        counts = self._window_counts()
        if counts.sum() == 0:
            raise RuntimeError(f"no stream holds {self.length} consecutive steps yet")
        streams = torch.multinomial(
            counts.float(), self.batch, replacement=True, generator=self.generator
        )
        offsets = (torch.rand(self.batch, generator=self.generator) * counts[streams]).long()
        oldest = self._oldest()[streams]
        positions = (oldest + offsets).unsqueeze(1) + torch.arange(self.length)
        rows = self._gather(streams.repeat_interleave(self.length), positions.reshape(-1))
        windows = TensorDict({}, [self.batch, self.length], device="cpu")
        for field in self.fields:
            value = field.decode(rows[field.name])
            windows.set(field.key, value.reshape(self.batch, self.length, *field.shape))
        return windows

    def _gather(self, streams: torch.Tensor, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """The stored rows at absolute ``positions`` of ``streams`` (one each), in
        order: one indexing per (stream, chunk) pair they fall in."""
        count = positions.numel()
        rows = {
            field.name: torch.empty((count, *field.stored_shape), dtype=field.stored_dtype)
            for field in self.fields
        }
        chunk = self.chunk
        span = int(self.written.max()) // chunk + 1
        group = streams * span + positions // chunk
        order = torch.argsort(group, stable=True)
        keys, sizes = torch.unique_consecutive(group[order], return_counts=True)
        for key, chosen in zip(keys.tolist(), order.split(sizes.tolist())):
            stream, index = divmod(key, span)
            source = self.chunks[stream][index * chunk]
            local = positions[chosen] - index * chunk
            for name, tensor in source.items():
                rows[name][chosen] = tensor[local]
        return rows

    def digest(self) -> str:
        """A checksum of the steps a sample can read, stream by stream, oldest first:
        each key (sorted by name), then its rows' bytes as sampled (decoded)."""
        hasher = hashlib.sha256()
        for stream in range(self.streams):
            oldest, newest = int(self._oldest()[stream]), int(self.written[stream])
            if newest == oldest:
                continue
            for field in sorted(self.fields, key=lambda field: str(field.key)):
                hasher.update(str(field.key).encode())
                for first in range(oldest - oldest % self.chunk, newest, self.chunk):
                    low, high = max(first, oldest) - first, min(first + self.chunk, newest) - first
                    rows = field.decode(self.chunks[stream][first][field.name][low:high])
                    hasher.update(rows.contiguous().numpy().tobytes())
        return hasher.hexdigest()

    # ------------------------------------------------------------------ checkpoints

    def _entry(self) -> dict:
        return {"written": self.written.clone(), "floor": self.floor.clone()}

    def _needs(self, entry: dict, stream: int) -> tuple[range, int | None]:
        """The chunk files (first rows) and the tail file (end) a checkpoint's state
        of ``stream`` reads back."""
        written, floor = int(entry["written"][stream]), int(entry["floor"][stream])
        oldest = max(written - self.per_stream, floor, 0)
        if oldest >= written:
            return range(0), None
        complete = written - written % self.chunk
        tail = written if written % self.chunk else None
        return range(oldest - oldest % self.chunk, complete, self.chunk), tail

    def _needed(self, stream: int, live: bool = True) -> tuple[set[int], set[int]]:
        """(chunk files, tail files) of ``stream`` that the kept checkpoints, the one
        being saved and (``live``) the live window need."""
        entries = [*self.kept.values(), *([self.pending[1]] if self.pending else [])]
        chunks, tails = set(), set()
        for entry in entries:
            firsts, tail = self._needs(entry, stream)
            chunks.update(firsts)
            if tail is not None:
                tails.add(tail)
        if live:
            chunks.update(self._needs(self._entry(), stream)[0])
        return chunks, tails

    def before_checkpoint(self, step: int) -> None:
        """Called by ``checkpoint.Saver`` with the env step of the checkpoint it saves."""
        self.saving = step

    def after_checkpoint(self, steps: list[int]) -> None:
        """Called by ``checkpoint.Saver`` once a checkpoint is written, with the env
        steps of the checkpoints now on disk: files none of them needs are deleted."""
        if self.pending is not None:
            step, entry = self.pending
            self.pending = None
            if step in steps:
                self.kept[step] = entry
                if self.legacy_files and self.legacy_before is None:
                    self.legacy_before = step
        self.kept = {step: entry for step, entry in self.kept.items() if step in steps}
        if not self.writes:
            return
        if self.legacy_before is not None and all(s >= self.legacy_before for s in steps):
            self._remove_legacy()
        for stream in range(self.streams):
            chunks, tails = self._needed(stream)
            folder = self._stream_dir(stream)
            for path in folder.iterdir() if folder.is_dir() else ():
                name = path.name
                if (found := CHUNK_FILE.fullmatch(name)) and int(found[1]) not in chunks:
                    path.unlink(missing_ok=True)
                elif (found := TAIL_FILE.fullmatch(name)) and int(found[1]) not in tails:
                    path.unlink(missing_ok=True)
                    self.tails[stream].discard(int(found[1]))
                elif name.startswith(".") and name.endswith(".tmp"):  # a crash's leftover
                    path.unlink(missing_ok=True)

    def state_dict(self) -> dict:
        state = {
            "layout": LAYOUT,
            "storage": "disk" if self.disk else "memory",
            "written": self.written.clone(),
            "floor": self.floor.clone(),
            "generator": self.generator.get_state(),
            "chunk": self.chunk,
            "fields": [field.to_state() for field in self.fields] if self.fields else None,
        }
        if not self.writes:  # no files: the contents travel in the state
            state["chunks"] = [self._inline(stream) for stream in range(self.streams)]
            return state
        entry = self._entry()
        for stream in range(self.streams):
            self._flush(stream, entry)
        self.pending = (self.saving, entry)
        state |= {
            "kept": {step: kept for step, kept in self.kept.items()} | {self.saving: entry},
            "legacy_files": self.legacy_files,
            "legacy_before": self.legacy_before,
        }
        if DEBUG:
            log.info("replay at checkpoint step %d: %s", self.saving, self.fingerprint())
        return state

    def _flush(self, stream: int, entry: dict) -> None:
        """What the checkpoint of ``entry`` needs on disk and is not there yet: chunks
        whose write failed before, and the stream's tail. A failure fails the
        checkpoint (``CheckpointError``: retried, counted by ``run.save_failures``)."""
        tail = self._needs(entry, stream)[1]
        for first in sorted(self.unsaved[stream]):
            path = self._chunk_path(stream, first)
            try:
                self._write(path, first, self.chunks[stream][first])
            except OSError as error:
                raise self._save_error(path, error) from None
            self.unsaved[stream].discard(first)
        if tail is None or tail in self.tails[stream]:
            return
        first = tail - tail % self.chunk
        rows = tail - first
        data = {name: value[:rows].clone() for name, value in self.chunks[stream][first].items()}
        path = self._tail_path(stream, tail)
        try:
            self._write(path, first, data)
        except OSError as error:
            raise self._save_error(path, error) from None
        self.tails[stream].add(tail)

    def _save_error(self, path: Path, error: OSError) -> CheckpointError:
        step = f" at step {self.saving}" if self.saving >= 0 else ""
        return CheckpointError(f"checkpoint{step} not written: {self._write_error(path, error)}")

    def _inline(self, stream: int) -> dict[int, dict[str, torch.Tensor]]:
        firsts, tail = self._needs(self._entry(), stream)
        chunks = {first: dict(self.chunks[stream][first]) for first in firsts}
        if tail is not None:
            first = tail - tail % self.chunk
            rows = tail - first
            chunks[first] = {n: v[:rows].clone() for n, v in self.chunks[stream][first].items()}
        return chunks

    def load_state_dict(self, state: dict) -> None:
        if "layout" not in state:  # checkpoint format 1: torchrl storages
            self._load_legacy(state)
        elif state["layout"] != LAYOUT:
            raise CheckpointError(f"replay: state layout {state['layout']}; this reads {LAYOUT}")
        else:
            self._load(state)
        if DEBUG:
            log.info("replay restored: %s", self.fingerprint())

    def _load(self, state: dict) -> None:
        self.started = True
        self.chunk = int(state["chunk"])
        self.written = state["written"].clone()
        self.floor = state["floor"].clone()
        self.generator.set_state(state["generator"])
        self.fields = [Field.from_state(field) for field in state["fields"] or ()] or None
        self.chunks = [{} for _ in range(self.streams)]
        self.tails = [set() for _ in range(self.streams)]
        self.unsaved = [set() for _ in range(self.streams)]
        if "chunks" in state:
            for stream, chunks in enumerate(state["chunks"]):
                for first, data in chunks.items():
                    self.chunks[stream][first] = self._padded(data)
            return
        if self.directory is None:
            raise CheckpointError("replay: this checkpoint's replay is in files; no folder given")
        entry = self._entry()
        for stream in range(self.streams):
            firsts, tail = self._needs(entry, stream)
            for first in firsts:
                path = self._chunk_path(stream, first)
                self.chunks[stream][first] = self._read(path, first, mapped=self.mapped)
            if tail is not None:
                first = tail - tail % self.chunk
                data = self._read(self._tail_path(stream, tail), first, mapped=False)
                self.chunks[stream][first] = self._padded(data)
                self.tails[stream].add(tail)
        self.kept = {int(step): kept for step, kept in state["kept"].items()}
        self.pending = None
        self.legacy_files = bool(state.get("legacy_files"))
        self.legacy_before = state.get("legacy_before")

    @property
    def mapped(self) -> bool:
        """Completed chunks read through a memory map (else into RAM)."""
        return self.disk or self.readonly

    def _padded(self, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A chunk of fewer rows (a tail) as a whole chunk the next writes go into."""
        rows = next(iter(data.values())).shape[0]
        if rows == self.chunk:
            return data
        chunk = self._new_chunk()
        for name, value in data.items():
            chunk[name][:rows] = value
        return chunk

    def _read(self, path: Path, first: int, mapped: bool) -> dict[str, torch.Tensor]:
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
            for field in self.fields:
                value = data[field.name]
                assert value.dtype == field.stored_dtype, field.name
                assert tuple(value.shape[1:]) == field.stored_shape, field.name
                assert 0 < value.shape[0] <= self.chunk
        except Exception as error:  # torch.load raises many kinds on a cut file
            detail = str(error).strip().splitlines()[0][:120] if str(error).strip() else ""
            raise CheckpointError(
                f"{path}: not a whole replay file ({detail or type(error).__name__}); {advice}"
            ) from None
        return data

    def fingerprint(self) -> str:
        """The digest, the generator's state and the counters, in one line (tests)."""
        generator = hashlib.sha256(self.generator.get_state().numpy().tobytes()).hexdigest()
        return (
            f"digest {self.digest()} generator {generator[:16]} "
            f"written {self.written.tolist()} floor {self.floor.tolist()}"
        )

    # ------------------------------------------------------------------ format 1

    def _load_legacy(self, state: dict) -> None:
        """A checkpoint-format-1 replay state: torchrl storages (``memory``: their
        contents in the state; ``disk``: a ring of memory-mapped files under the folder
        and ``written.npy``), converted into chunks, whose files are written here as
        they complete. A disk ring is kept until no format-1 checkpoint is left."""
        self.started = True
        written = state["written"].clone()
        self.floor = state["floor"].clone()
        self.generator.set_state(state["generator"])
        if state.get("storage") == "disk":
            sources = self._legacy_ring(written)
            self.legacy_files = self.writes
        else:
            from torchrl.data import LazyTensorStorage

            sources = []
            for saved in state["streams"]:
                storage = None
                if saved is not None:
                    storage = LazyTensorStorage(self.per_stream)
                    storage.load_state_dict(saved)
                sources.append(storage)
        self.written = torch.zeros_like(written)
        for stream, source in enumerate(sources):
            end = int(written[stream])
            oldest = max(end - self.per_stream, int(self.floor[stream]), 0)
            self.written[stream] = at = oldest
            while at < end:  # a chunk at a time
                last = min(at - at % self.chunk + self.chunk, end)
                slots = torch.arange(at, last) % self.per_stream
                rows = source[slots] if isinstance(source, TensorDictBase) else source.get(slots)
                if self.fields is None:
                    self.fields = self._learn(rows)
                values = {field.name: field.encode(rows.get(field.key)) for field in self.fields}
                self._append(stream, values)
                at = last
        log.info(
            "replay: converted a checkpoint-format-1 replay (%d transitions) to chunks", len(self)
        )

    def _legacy_ring(self, written: torch.Tensor) -> list:
        cursors = self.directory / LEGACY_CURSORS if self.directory else None
        if cursors is None or not cursors.is_file():
            raise CheckpointError(
                f"{cursors or 'replay'}: missing: this checkpoint (format 1, "
                "replay.storage=disk) reads its replay from that run directory's "
                "memory-mapped files; resume it in its own run directory, or start a new "
                "run from its weights (run.from_checkpoint)"
            )
        on_disk = torch.from_numpy(np.load(cursors).astype(np.int64))
        # steps written after the checkpoint overwrote the oldest ones of full streams
        self.floor = torch.maximum(self.floor, on_disk - self.per_stream)
        sources = []
        for stream in range(self.streams):
            if int(written[stream]) == 0:
                sources.append(None)
                continue
            try:
                sources.append(TensorDict.load_memmap(self._stream_dir(stream)))
            except Exception as error:
                raise CheckpointError(
                    f"{self._stream_dir(stream)}: not a readable format-1 replay ({error})"
                ) from None
        return sources

    def _remove_legacy(self) -> None:
        """The format-1 ring, once no checkpoint on disk reads it."""
        self.legacy_files, self.legacy_before = False, None
        (self.directory / LEGACY_CURSORS).unlink(missing_ok=True)
        for stream in range(self.streams):
            folder = self._stream_dir(stream)
            for path in folder.iterdir() if folder.is_dir() else ():
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                elif not (CHUNK_FILE.fullmatch(path.name) or TAIL_FILE.fullmatch(path.name)):
                    path.unlink(missing_ok=True)
        log.info("replay: removed the format-1 replay files (no checkpoint reads them now)")


def memory_limit() -> int:
    """This machine's RAM, or the cgroup's limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(limit).read_text().strip()))  # "max": no limit
    return total


def release_freed_memory() -> None:
    """Give the heap's free pages back to the OS (glibc's ``malloc_trim``). Chunk-sized
    blocks freed between long-lived ones stay in glibc's heap, counted as resident: a
    disk replay's resident memory grew with the data that way (by ~1 GB per 100k 64x64
    frames in ``tests/test_replay_memory.py``), although nothing held them."""
    global _TRIM
    if _TRIM is None:
        try:
            _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            _TRIM = False
    if _TRIM:
        _TRIM(0)


_TRIM = None


def _bytes_under(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e7 else f"{size / 1e6:.2f} MB"
