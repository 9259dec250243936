"""Replay: one stream per env worker, sampled as windows of consecutive steps.

Not torchrl's: its ``SliceSampler`` cuts trajectories by contiguous storage, which the
collector's interleaved chunks break, and cannot exclude windows across a write cursor; its
lazy storages allocate the whole capacity at once (Crafter: 12 GB), all of it checkpointed.
Here each stream is ``CHUNK``-row chunks addressed by absolute time (``written``), allocated
as it fills and dropped once the ring has passed them.

With a ``directory``, chunks are written as files (``replay_files``); ``storage="disk"``
reads them back through memory maps, ``memory`` keeps them in RAM. Without files (no
folder, or a rank that does not checkpoint) a checkpoint holds the contents. Row layout:
``replay_rows``; format-1 checkpoints: ``replay_format1``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase

from dreamer.data import replay_format1
from dreamer.data.replay_files import (
    Chunk,
    ReplayFiles,
    chunk_path,
    read_file,
    reads,
    tail_path,
    tail_rows,
)
from dreamer.data.replay_ram import SpareChunks, memory_limit
from dreamer.data.replay_rows import (
    ACTION,
    ENV_INDEX,
    Field,
    action_heads,
    random_batch,
    replay_keys,
    row_bytes,
)
from dreamer.errors import ConfigError
from dreamer.runtime.checkpoint import CheckpointError
from dreamer.runtime.malloc import release_freed_memory

__all__ = [
    "ENV_INDEX",
    "LAYOUT",
    "SequenceReplay",
    "action_heads",
    "memory_limit",
    "random_batch",
    "replay_keys",
    "row_bytes",
]
log = logging.getLogger("dreamer")
CHUNK = 1024  # rows per chunk (Crafter: 12.6 MB)
LAYOUT = 2  # of the replay's state: chunk files and an index (1: torchrl storages)
DEBUG_VARIABLE = "DREAMER_REPLAY_DEBUG"  # =1: log fingerprints at checkpoints and resumes


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
        """The run's replay (with several ranks, this rank's share). ``heads``: the one-hot
        action heads; ``readonly``: a checkpoint's, never written (``dreamer.evaluate``).
        Only rank 0 checkpoints, so only its memory replay writes files."""
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
        self.readonly = readonly
        # files: chunks are written (to be checkpointed, or mapped); readonly: never
        self.files: ReplayFiles | None = None
        if self.directory is not None and (persist or self.disk) and not readonly:
            self.files = ReplayFiles(
                self.directory, streams, self.per_stream, self.chunk, self.disk
            )
        # written[i]: transitions ever written to stream i (its write cursor in time)
        self.written = torch.zeros(streams, dtype=torch.long)
        # floor[i]: stream i's oldest intact step (> 0 only in a converted format-1 disk ring)
        self.floor = torch.zeros(streams, dtype=torch.long)
        self.generator = torch.Generator().manual_seed(seed)
        self.fields: list[Field] | None = None  # learned from the first write, or loaded
        self.chunks: list[dict[int, Chunk]] = [{} for _ in range(streams)]
        self.spare = SpareChunks()

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
        """Log what ``transitions`` (capped at capacity) will need; ``ConfigError`` where RAM
        (memory replay) or free disk plus the replay's own files (written chunks) is short."""
        rows = min(transitions, self.per_stream * self.streams)
        need = rows * per_row
        ram = memory_limit()
        where = "in memory-mapped files" if self.disk else "in RAM"
        free = None
        if self.files is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.directory).free + _bytes_under(self.directory)
        on_disk = f", {_gb(free)} free for it under {self.directory}" if free is not None else ""
        log.info(
            "replay: up to %s transitions of about %s B: %s %s (this machine: %s RAM%s)",
            f"{rows:,}",
            f"{per_row:,}",
            _gb(need),
            where + (" and as files" if self.files is not None and not self.disk else ""),
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
        if self.files is not None and not self.files.claimed:
            self.files.start_fresh()
        values = self._encoded(data)
        for stream in env_index.unique().tolist():
            mine = env_index == stream
            self._append(stream, {name: value[mine] for name, value in values.items()})

    def append_stream(self, stream: int, rows: TensorDictBase) -> None:
        """Append consecutive transitions of one stream (a converted replay's)."""
        self._append(stream, self._encoded(rows))

    def _encoded(self, data: TensorDictBase) -> Chunk:
        if self.fields is None:
            self.fields = self._learn(data)
        return {field.name: field.encode(data.get(field.key)) for field in self.fields}

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

    def _append(self, stream: int, rows: Chunk) -> None:
        count = next(iter(rows.values())).shape[0]
        start = int(self.written[stream])
        end = start + count
        chunk = self.chunk
        at = max(start, end - self.per_stream)  # older rows would be dropped at once
        completed = []
        while at < end:
            first = at - at % chunk
            if first not in self.chunks[stream]:
                self.chunks[stream][first] = self.spare.new(self.fields, chunk)
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

    def _completed(self, stream: int, first: int) -> None:
        """A chunk just filled: its file written (a disk replay then maps it)."""
        if self.files is None:
            return
        chunk = self.chunks[stream][first]
        if not self.files.completed(stream, first, chunk):
            return  # unwritten: kept in RAM
        if self.disk:
            self.spare.keep(chunk)
            path = chunk_path(self.directory, stream, first)
            self.chunks[stream][first] = self._read(path, first, mapped=True)
        release_freed_memory()  # once a chunk: what the chunk's writes freed

    def _evict(self, stream: int) -> None:
        """Drop the chunks the ring has passed (and their files: ``ReplayFiles.evicted``)."""
        oldest = int(self._oldest()[stream])
        passed = [first for first in self.chunks[stream] if first + self.chunk <= oldest]
        if not passed:
            return
        for first in passed:
            chunk = self.chunks[stream].pop(first)
            if self.files is not None and not self.disk:  # a state without files holds chunks
                self.spare.keep(chunk)
        if self.files is not None:
            self.files.evicted(stream, passed)

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

    def _gather(self, streams: torch.Tensor, positions: torch.Tensor) -> Chunk:
        """The rows at absolute ``positions`` of ``streams``, in order; one indexing a chunk."""
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
        """SHA-256 of the steps a sample can read: by stream, each key (by name), decoded rows."""
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

    def fingerprint(self) -> str:
        """The digest, the generator's state and the counters, in one line (tests)."""
        generator = hashlib.sha256(self.generator.get_state().numpy().tobytes()).hexdigest()
        return (
            f"digest {self.digest()} generator {generator[:16]} "
            f"written {self.written.tolist()} floor {self.floor.tolist()}"
        )

    # ------------------------------------------------------------------ checkpoints

    def _entry(self) -> dict:
        return {"written": self.written.clone(), "floor": self.floor.clone()}

    def before_checkpoint(self, step: int) -> None:
        """Called by ``checkpoint.Saver`` with the env step of the checkpoint it saves."""
        if self.files is not None:
            self.files.before_checkpoint(step)

    def after_checkpoint(self, steps: list[int]) -> None:
        """Called by ``checkpoint.Saver`` with the env steps of the checkpoints on disk."""
        if self.files is not None:
            self.files.after_checkpoint(steps, live=self._entry())

    def state_dict(self) -> dict:
        state = {
            "layout": LAYOUT,
            "storage": "disk" if self.disk else "memory",
            **self._entry(),
            "generator": self.generator.get_state(),
            "chunk": self.chunk,
            "fields": [field.to_state() for field in self.fields] if self.fields else None,
        }
        if self.files is None:  # the contents travel in the state
            state["chunks"] = [self._inline(stream) for stream in range(self.streams)]
            return state
        state |= self.files.save(self._entry(), self.chunks)
        if os.environ.get(DEBUG_VARIABLE):
            step = self.files.checkpoints.saving
            log.info("replay at checkpoint step %d: %s", step, self.fingerprint())
        return state

    def _inline(self, stream: int) -> dict[int, Chunk]:
        firsts, tail = reads(self._entry(), stream, self.per_stream, self.chunk)
        chunks = {first: dict(self.chunks[stream][first]) for first in firsts}
        if tail is not None:
            first, rows = tail_rows(self.chunks[stream], tail, self.chunk)
            chunks[first] = rows
        return chunks

    def load_state_dict(self, state: dict) -> None:
        if "layout" not in state:  # checkpoint format 1: torchrl storages
            replay_format1.convert(self, state)
        elif state["layout"] != LAYOUT:
            raise CheckpointError(f"replay: state layout {state['layout']}; this reads {LAYOUT}")
        else:
            self._load(state)
        if os.environ.get(DEBUG_VARIABLE):
            log.info("replay restored: %s", self.fingerprint())

    def _load(self, state: dict) -> None:
        self.chunk = int(state["chunk"])
        self.written = state["written"].clone()
        self.floor = state["floor"].clone()
        self.generator.set_state(state["generator"])
        self.fields = [Field.from_state(field) for field in state["fields"] or ()] or None
        self.chunks = [{} for _ in range(self.streams)]
        if "chunks" in state:
            for stream, chunks in enumerate(state["chunks"]):
                for first, data in chunks.items():
                    self.chunks[stream][first] = self._padded(data)
        else:
            self._read_files()
        if self.files is not None:
            self.files.loaded(state)

    def _read_files(self) -> None:
        """The chunk and tail files the state just loaded reads back."""
        if self.directory is None:
            raise CheckpointError("replay: this checkpoint's replay is in files; no folder given")
        entry = self._entry()
        mapped = self.disk or self.readonly  # completed chunks: a memory map, else RAM
        for stream in range(self.streams):
            firsts, tail = reads(entry, stream, self.per_stream, self.chunk)
            for first in firsts:
                path = chunk_path(self.directory, stream, first)
                self.chunks[stream][first] = self._read(path, first, mapped=mapped)
            if tail is not None:
                first = tail - tail % self.chunk
                data = self._read(tail_path(self.directory, stream, tail), first, mapped=False)
                self.chunks[stream][first] = self._padded(data)

    def _read(self, path: Path, first: int, mapped: bool) -> Chunk:
        return read_file(path, first, self.fields, self.chunk, mapped)

    def _padded(self, data: Chunk) -> Chunk:
        """A chunk of fewer rows (a tail) as a whole chunk the next writes go into."""
        rows = next(iter(data.values())).shape[0]
        if rows == self.chunk:
            return data
        chunk = self.spare.new(self.fields, self.chunk)
        for name, value in data.items():
            chunk[name][:rows] = value
        return chunk


def _bytes_under(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e7 else f"{size / 1e6:.2f} MB"
