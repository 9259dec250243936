"""The replay of checkpoint format 1 (before issue 37), as it was: torchrl storages
preallocated at their full capacity, a memory checkpoint holding their contents, a disk
one a ring of memory-mapped files. The tests write its states and files and check that
today's replay converts them exactly (same digest, same next samples), and sample
both side by side."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyMemmapStorage, LazyTensorStorage

from dreamer.outputs.logs import OutputError

ENV_INDEX = "env_index"


class LegacyReplay:
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
    ):
        self.per_stream = max(capacity // streams, length)
        self.streams = streams
        self.batch = batch
        self.length = length
        self.keys = keys
        self.disk = storage == "disk"
        if self.disk:
            self.directory = Path(directory)
            self.directory.mkdir(parents=True, exist_ok=True)
            self.storages = [
                LazyMemmapStorage(
                    self.per_stream,
                    scratch_dir=self._stream_dir(i),
                    existsok=True,
                    auto_cleanup=False,
                )
                for i in range(streams)
            ]
            cursors = self.directory / "written.npy"
            if not cursors.exists():
                np.save(cursors, np.zeros(streams, np.int64))
            self._on_disk = np.load(cursors, mmap_mode="r+")
        else:
            self.storages = [LazyTensorStorage(self.per_stream) for _ in range(streams)]
        # written[i]: transitions ever written to stream i (its write cursor in time)
        self.written = torch.zeros(streams, dtype=torch.long)
        # floor[i]: the oldest step of stream i still intact (see the module docstring)
        self.floor = torch.zeros(streams, dtype=torch.long)
        self.generator = torch.Generator().manual_seed(seed)

    def _stream_dir(self, stream: int) -> Path:
        return self.directory / f"stream{stream}"

    def _oldest(self) -> torch.Tensor:
        return torch.maximum(self.written - self.per_stream, self.floor).clamp(min=0)

    def __len__(self) -> int:
        return int((self.written - self._oldest()).sum())

    def extend(self, data: TensorDictBase) -> None:
        """Append a batch of transitions routed by their ``env_index`` entry."""
        data = data.reshape(-1)
        env_index = data.get(ENV_INDEX).reshape(-1)
        data = data.select(*self.keys)
        for stream in env_index.unique().tolist():
            rows = data[env_index == stream]
            count = rows.shape[0]
            start = int(self.written[stream])
            positions = torch.arange(start, start + count) % self.per_stream
            if count > self.per_stream:  # keep only what fits
                rows, positions = rows[-self.per_stream :], positions[-self.per_stream :]
            if self.disk:  # the cursor on disk first: it bounds what a crash may overwrite
                end = int(self.written[stream]) + count
                self._on_disk[stream] = max(int(self._on_disk[stream]), end)
            self.storages[stream].set(positions, rows)
            self.written[stream] += count
            if self.disk and start == 0:  # the stream's first write made its files
                self._reserve(stream)

    def _reserve(self, stream: int) -> None:
        """Allocate the stream's files in full at its first write: a full disk is then
        one ``OutputError`` here, never a SIGBUS when a later write touches a page of the
        memory map that the filesystem cannot back. A resume whose checkpoint saw no
        write to the stream allocates again (the earlier run may have died in between)."""
        for path in sorted(self._stream_dir(stream).rglob("*.memmap")):
            size = path.stat().st_size
            with path.open("r+b") as handle:
                try:
                    os.posix_fallocate(handle.fileno(), 0, size)
                except OSError as error:
                    raise OutputError(
                        f"replay: {path}: {error.strerror} (it needs {size:,} bytes)"
                    ) from None

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
        positions = positions % self.per_stream
        # one storage read per stream, then back into the sampled order
        rows, parts = [], []
        for stream in streams.unique().tolist():
            chosen = (streams == stream).nonzero().squeeze(1)
            rows.append(chosen)
            parts.append(self.storages[stream].get(positions[chosen].reshape(-1)))
        windows = torch.cat(parts, 0).reshape(self.batch, self.length)
        return windows[torch.cat(rows).argsort()]

    def state_dict(self) -> dict:
        state = {
            "written": self.written.clone(),
            "floor": self.floor.clone(),
            "generator": self.generator.get_state(),
        }
        if self.disk:  # the contents stay in their files
            return state | {"storage": "disk"}
        streams = [storage.state_dict() if len(storage) else None for storage in self.storages]
        return state | {"storage": "memory", "streams": streams}

    def load_state_dict(self, state: dict) -> None:
        self.written = state["written"].clone()
        self.floor = state["floor"].clone()
        self.generator.set_state(state["generator"])
        if not self.disk:
            for storage, saved in zip(self.storages, state["streams"], strict=True):
                if saved is not None:
                    storage.load_state_dict(saved)
            return
        on_disk = torch.from_numpy(np.array(self._on_disk))
        # steps written after the checkpoint overwrote the oldest ones of full streams
        self.floor = torch.maximum(self.floor, on_disk - self.per_stream)
        for stream, storage in enumerate(self.storages):
            if self.written[stream] == 0:
                continue
            length = int(min(on_disk[stream], self.per_stream))
            # torchrl has no public "open existing memmap"
            storage._storage = TensorDict.load_memmap(self._stream_dir(stream))
            storage.initialized = True
            storage._len = length

    def digest(self) -> str:
        """A checksum of the steps a sample can read, stream by stream, oldest first."""
        import hashlib

        hasher = hashlib.sha256()
        for stream, storage in enumerate(self.storages):
            oldest, newest = int(self._oldest()[stream]), int(self.written[stream])
            if newest == oldest:
                continue
            rows = storage.get(torch.arange(oldest, newest) % self.per_stream)
            for key in sorted(rows.keys(True, True), key=str):
                hasher.update(str(key).encode())
                hasher.update(rows.get(key).contiguous().numpy().tobytes())
        return hasher.hexdigest()
