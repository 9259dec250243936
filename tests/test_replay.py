import pytest
import torch
from tensordict import TensorDict

from dreamer.data.replay import SequenceReplay
from tests.test_replay_files import mapped_file

KEYS = ["step", "is_init", ("next", "obs")]


def chunk(stream: int, first: int, count: int) -> TensorDict:
    """``count`` consecutive transitions of one worker, numbered from ``first``."""
    steps = torch.arange(first, first + count)
    return TensorDict(
        {
            "env_index": torch.full((count,), stream),
            "step": steps * 10 + stream,  # encodes (time, stream) to check windows
            "is_init": (steps % 7 == 0).unsqueeze(-1),
            "extra": torch.zeros(count),
            "next": {"obs": (steps * 10 + stream).float()},
        },
        [count],
    )


def interleaved(streams: int, chunks: int, size: int) -> list[TensorDict]:
    return [chunk(s, c * size, size) for c in range(chunks) for s in range(streams)]


def test_windows_are_consecutive_steps_of_one_stream():
    replay = SequenceReplay(capacity=300, streams=3, batch=64, length=8, keys=KEYS)
    for data in interleaved(streams=3, chunks=5, size=16):
        replay.extend(data)
    batch = replay.sample()
    assert batch.shape == (64, 8)
    steps = batch["step"]
    stream = steps % 10
    time = steps // 10
    assert (stream == stream[:, :1]).all(), "a window mixes streams"
    assert (time.diff(dim=1) == 1).all(), "a window is not consecutive in time"
    assert "extra" not in batch.keys(), "only the configured keys are stored"


def test_windows_never_cross_the_write_cursor_after_wraparound():
    # 40 slots per stream, 100 steps written: slots hold steps 60..99 out of order
    replay = SequenceReplay(capacity=40, streams=1, batch=256, length=10, keys=KEYS)
    for first in range(0, 100, 20):
        replay.extend(chunk(0, first, 20))
    time = replay.sample()["step"] // 10
    assert (time.diff(dim=1) == 1).all()
    assert time.min() >= 60 and time.max() <= 99
    assert len(replay) == 40


def test_sampling_waits_for_a_full_window_and_is_seeded():
    replay = SequenceReplay(capacity=100, streams=2, batch=4, length=10, keys=KEYS, seed=3)
    replay.extend(chunk(0, 0, 9))
    assert not replay.can_sample()
    with pytest.raises(RuntimeError):
        replay.sample()
    replay.extend(chunk(0, 9, 5))
    assert replay.can_sample()
    other = SequenceReplay(capacity=100, streams=2, batch=4, length=10, keys=KEYS, seed=3)
    other.extend(chunk(0, 0, 9))
    other.extend(chunk(0, 9, 5))
    assert torch.equal(replay.sample()["step"], other.sample()["step"])


def test_state_dict_round_trip_restores_contents_and_sampling():
    replay = SequenceReplay(capacity=64, streams=2, batch=8, length=4, keys=KEYS, seed=1)
    for data in interleaved(streams=2, chunks=3, size=8):
        replay.extend(data)
    saved = replay.state_dict()
    restored = SequenceReplay(capacity=64, streams=2, batch=8, length=4, keys=KEYS, seed=99)
    restored.load_state_dict(saved)
    assert len(restored) == len(replay)
    batch = restored.sample()
    assert torch.equal(batch["step"], replay.sample()["step"])
    assert torch.equal(batch["next", "obs"], batch["step"].float()), "nested keys restored"


def disk_replay(directory, seed=1, capacity=80, chunk=16):
    return SequenceReplay(
        capacity,
        2,
        batch=16,
        length=5,
        keys=KEYS,
        seed=seed,
        storage="disk",
        directory=directory,
        chunk=chunk,
    )


def test_disk_resume_maps_the_same_contents_without_a_copy(tmp_path):
    replay = disk_replay(tmp_path / "replay")
    for data in interleaved(streams=2, chunks=7, size=8):  # 56 steps per 40-slot stream
        replay.extend(data)
    saved = replay.state_dict()
    assert "chunks" not in saved  # the checkpoint holds an index, not contents
    digest = replay.digest()
    restored = disk_replay(tmp_path / "replay", seed=99)
    restored.load_state_dict(saved)
    assert restored.digest() == digest and len(restored) == len(replay) == 80
    complete = [chunk for first, chunk in restored.chunks[0].items() if first + 16 <= 56]
    assert complete and all(  # completed chunks are read through a map of their files
        "chunk-" in (mapped_file(tensor) or "") for c in complete for tensor in c.values()
    )
    assert torch.equal(restored.sample()["step"], replay.sample()["step"])
    memory = SequenceReplay(80, 2, batch=16, length=5, keys=KEYS, seed=1)
    for data in interleaved(streams=2, chunks=7, size=8):
        memory.extend(data)
    assert memory.digest() == digest  # same steps either way


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_steps_written_after_the_checkpoint_leave_its_steps_whole(storage, tmp_path):
    """Files are never overwritten in place: after a checkpoint the run writes on (and
    wraps around its streams) and is killed; a resume from that checkpoint finds all
    of its steps, not only those the later writes spared."""
    replay = SequenceReplay(
        80, 2, 16, 5, KEYS, seed=1, storage=storage, directory=tmp_path / "r", chunk=16
    )
    for data in interleaved(streams=2, chunks=6, size=8):  # 48 steps per stream
        replay.extend(data)
    saved, digest = replay.state_dict(), replay.digest()  # the last checkpoint
    for data in [chunk(0, 48, 8), chunk(0, 56, 30)]:  # then 38 more steps, then a kill -9
        replay.extend(data)
    restored = SequenceReplay(
        80, 2, 16, 5, KEYS, seed=5, storage=storage, directory=tmp_path / "r", chunk=16
    )
    restored.load_state_dict(saved)
    assert restored.digest() == digest and len(restored) == 80
    for _ in range(20):
        time = restored.sample()["step"] // 10
        assert (time.diff(dim=1) == 1).all() and (time <= 47).all()
    restored.extend(chunk(0, 48, 30))  # the resumed run writes its own steps 48..77
    time = restored.sample()["step"] // 10
    assert (time.diff(dim=1) == 1).all() and len(restored) == 80


@pytest.mark.parametrize(
    "overrides", [["env=crafter"], ["env=cartpole"], ["env=dmc", "env.task=cartpole_balance"]]
)
def test_random_batch_has_the_layout_of_a_real_sample(overrides):
    """The start estimate times an update on ``random_batch``: a compiled update must not
    recompile for the real samples (same keys, dtypes and shapes)."""
    from dreamer.command_line import load
    from dreamer.data.replay import random_batch
    from tests.batches import real_batch

    def layout(batch):
        return {k: (v.dtype, v.shape) for k, v in batch.items(True, True)}

    spaces, real = real_batch(load([*overrides, "model=tiny"]), 2, 8)
    assert layout(random_batch(spaces, 2, 8)) == layout(real)
