"""The replay of checkpoint format 1 (torchrl storages), converted into chunks: a memory
replay's storages travel in its state; a disk replay's are a ring of memory-mapped files
and ``written.npy``, its write cursors, kept while a format-1 checkpoint is."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from dreamer.data.replay_files import FORMAT1_CURSORS, stream_dir
from dreamer.runtime.checkpoint import CheckpointError

log = logging.getLogger("dreamer")


def convert(replay, state: dict) -> None:
    """Load a format-1 replay ``state`` into ``replay`` (a ``SequenceReplay``): the same
    steps, the same generator, so the same next samples."""
    disk = state.get("storage") == "disk"
    if replay.files is not None:
        replay.files.converted(ring=disk)
    written = state["written"].clone()
    replay.floor = state["floor"].clone()
    replay.generator.set_state(state["generator"])
    if disk:
        sources, on_disk = _ring(replay.directory, replay.streams, written)
        # steps written after the checkpoint overwrote the oldest ones of full streams
        replay.floor = torch.maximum(replay.floor, on_disk - replay.per_stream)
    else:
        sources = _storages(replay.per_stream, state["streams"])
    replay.written = torch.zeros_like(written)
    for stream, source in enumerate(sources):
        end = int(written[stream])
        oldest = max(end - replay.per_stream, int(replay.floor[stream]), 0)
        replay.written[stream] = at = oldest
        while at < end:  # a chunk at a time
            last = min(at - at % replay.chunk + replay.chunk, end)
            slots = torch.arange(at, last) % replay.per_stream
            rows = source[slots] if isinstance(source, TensorDictBase) else source.get(slots)
            replay.append_stream(stream, rows)
            at = last
    log.info(
        "replay: converted a checkpoint-format-1 replay (%d transitions) to chunks", len(replay)
    )


def _storages(per_stream: int, saved_streams: list) -> list:
    """A memory replay's torchrl storages, from their states (None: an empty stream)."""
    from torchrl.data import LazyTensorStorage

    storages = []
    for saved in saved_streams:
        storage = None
        if saved is not None:
            storage = LazyTensorStorage(per_stream)
            storage.load_state_dict(saved)
        storages.append(storage)
    return storages


def _ring(directory: Path | None, streams: int, written: torch.Tensor) -> tuple[list, torch.Tensor]:
    """A disk replay's streams (memory-mapped, None where the checkpoint saw no write)
    and its cursors on disk, which may be past the checkpoint's ``written``."""
    cursors = directory / FORMAT1_CURSORS if directory else None
    if cursors is None or not cursors.is_file():
        raise CheckpointError(
            f"{cursors or 'replay'}: missing: this checkpoint (format 1, "
            "replay.storage=disk) reads its replay from that run directory's "
            "memory-mapped files; resume it in its own run directory, or start a new "
            "run from its weights (run.from_checkpoint)"
        )
    on_disk = torch.from_numpy(np.load(cursors).astype(np.int64))
    sources = []
    for stream in range(streams):
        if int(written[stream]) == 0:
            sources.append(None)
            continue
        try:
            sources.append(TensorDict.load_memmap(stream_dir(directory, stream)))
        except Exception as error:
            raise CheckpointError(
                f"{stream_dir(directory, stream)}: not a readable format-1 replay ({error})"
            ) from None
    return sources, on_disk
