"""The replay's own storage (issue 37): chunks allocated as streams fill, each written
once as it completes; a checkpoint writes only the streams' tails and an index; files
live as long as a kept checkpoint reads them; one-hot actions stored as indices;
checkpoint-format-1 replays converted exactly; a capacity the machine cannot hold
refused in one line."""

import errno
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch.nn import functional

from dreamer.data import replay as replay_module
from dreamer.data import replay_files
from dreamer.data.replay import SequenceReplay, action_heads, row_bytes
from dreamer.errors import ConfigError
from dreamer.outputs.logs import OutputError
from dreamer.runtime import checkpoint
from tests.batches import MASKED
from tests.legacy_replay import LegacyReplay

KEYS = ["action", "is_init", ("next", "obs")]
HEADS = (5, 4, 6)  # MineDojo-like: three one-hot heads side by side


def transitions(stream: int, first: int, count: int, heads=HEADS) -> TensorDict:
    """``count`` consecutive transitions of one worker; ``obs`` encodes (time, stream),
    the action is one-hot per head (int64, as the collector delivers it)."""
    steps = torch.arange(first, first + count)
    choices = [(steps * (i + 3) + stream) % n for i, n in enumerate(heads)]
    action = torch.cat([functional.one_hot(c, n) for c, n in zip(choices, heads)], -1)
    return TensorDict(
        {
            "env_index": torch.full((count,), stream),
            "action": action,
            "is_init": (steps % 7 == 0).unsqueeze(-1),
            "next": {"obs": (steps * 10 + stream).float().unsqueeze(-1).expand(count, 3)},
        },
        [count],
    )


def fill(replay, streams: int, start: int, stop: int, size: int = 8) -> None:
    for first in range(start, stop, size):
        for stream in range(streams):
            replay.extend(transitions(stream, first, min(size, stop - first)))


def make(directory, storage="memory", capacity=96, seed=1, streams=2, **kwargs):
    kwargs = {"heads": HEADS, "chunk": 16, **kwargs}
    return SequenceReplay(
        capacity, streams, 8, 5, KEYS, seed, storage=storage, directory=directory, **kwargs
    )


def files(directory: Path) -> dict[str, int]:
    return {
        str(path.relative_to(directory)): path.stat().st_size
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def mapped_file(tensor: torch.Tensor) -> str | None:
    """The file whose memory map holds ``tensor``'s data (Linux /proc), else None."""
    address = tensor.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        if low <= address < high:
            return fields[5] if len(fields) > 5 and fields[5].startswith("/") else None
    return None


class Saves:
    """What ``checkpoint.Saver`` does around a replay: before/after hooks, the states
    of the checkpoints kept (``keep``), their env steps."""

    def __init__(self, replay, keep: int = 2):
        self.replay, self.keep, self.states = replay, keep, {}

    def __call__(self, step: int) -> dict:
        self.replay.before_checkpoint(step)
        state = self.replay.state_dict()
        self.states[step] = (state, self.replay.digest())
        for old in sorted(self.states)[: -self.keep]:
            del self.states[old]
        self.replay.after_checkpoint(sorted(self.states))
        return state


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_a_save_writes_the_tails_and_each_chunk_is_written_once(storage, tmp_path):
    replay = make(tmp_path / "r", storage)
    fill(replay, 2, 0, 20)  # 20 per stream: one chunk of 16 complete, a tail of 4
    assert set(files(tmp_path / "r")) == {f"stream{i}/chunk-{0:012d}.pt" for i in (0, 1)}
    saves = Saves(replay)
    saves(40)
    assert set(files(tmp_path / "r")) == {
        *(f"stream{i}/chunk-{0:012d}.pt" for i in (0, 1)),
        *(f"stream{i}/tail-{20:012d}.pt" for i in (0, 1)),
    }
    before = {name: path.stat().st_mtime_ns for name, path in _paths(tmp_path / "r").items()}
    fill(replay, 2, 20, 30)
    saves(60)  # only the new tails are written; the chunks stay as they were
    after = _paths(tmp_path / "r")
    for name, mtime in before.items():
        if "chunk" in name:
            assert after[name].stat().st_mtime_ns == mtime, name
    assert {name for name in after if "tail" in name} == {
        f"stream{i}/tail-{end:012d}.pt" for i in (0, 1) for end in (20, 30)
    }
    saves(60)  # the same steps again: nothing new to write
    assert _paths(tmp_path / "r").keys() == after.keys()


def _paths(directory: Path) -> dict[str, Path]:
    return {
        str(path.relative_to(directory)): path for path in directory.rglob("*") if path.is_file()
    }


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_every_kept_checkpoint_resumes_exactly_and_the_rest_is_deleted(storage, tmp_path):
    """Saves while the streams wrap around (capacity 48 per stream, chunks of 16): each
    checkpoint kept restores its digest, its next samples and its generator; files no
    kept checkpoint reads are gone."""
    replay = make(tmp_path / "r", storage)
    saves = Saves(replay, keep=2)
    for step, stop in enumerate((12, 40, 70, 101, 150), 1):
        fill(replay, 2, int(replay.written[0]), stop)
        replay.sample()  # the generator moves on between saves
        saves(step * 100)
    assert sorted(saves.states) == [400, 500]
    for step, (state, digest) in saves.states.items():
        restored = make(tmp_path / "r", storage, seed=7)
        restored.load_state_dict(state)
        assert restored.digest() == digest, step
        twin = make(None, "memory", seed=7)  # the same steps, never saved
        fill(twin, 2, 0, int(state["written"][0]))
        twin.generator.set_state(state["generator"])
        assert twin.digest() == digest
        for _ in range(3):
            a, b = restored.sample(), twin.sample()
            assert all(torch.equal(a[key], b[key]) for key in a.keys(True, True)), step
    # stream 0 at 150 (oldest 102), the oldest kept at 101 (oldest 53): chunks from 48
    names = set(files(tmp_path / "r"))
    assert {int(re.search(r"chunk-(\d+)", n)[1]) for n in names if "stream0/chunk" in n} == {
        48,
        64,
        80,
        96,
        112,
        128,
    }
    assert {n for n in names if "stream0/tail" in n} == {
        f"stream0/tail-{101:012d}.pt",
        f"stream0/tail-{150:012d}.pt",
    }


def test_ram_and_disk_follow_the_fill_not_the_capacity(tmp_path):
    replay = make(tmp_path / "r", "memory", capacity=2_000_000, chunk=1024)
    fill(replay, 2, 0, 3000, size=500)
    per_row = replay.row_bytes
    assert per_row == 3 + 1 + 12  # three uint8 action indices, is_init, 3 float32
    # 3000 per stream: two chunks complete, the third open (1024 rows allocated)
    assert replay.allocated_bytes() == 2 * 3 * 1024 * per_row
    # two chunks per stream written (the zip's headers: about 2 KB a file)
    assert sum(files(tmp_path / "r").values()) < 2 * 2 * (1024 * per_row + 2500)
    disk = make(tmp_path / "d", "disk", capacity=2_000_000, chunk=1024)
    fill(disk, 2, 0, 3000, size=500)
    mapped = [t for s in disk.chunks for c in s.values() for t in c.values()]
    assert sum(bool(mapped_file(t)) for t in mapped) == 2 * 2 * 3  # chunks 0 and 1


def test_one_hot_actions_are_stored_as_indices_and_sampled_as_they_came(tmp_path):
    replay = make(None, "memory", capacity=64, streams=1)
    replay.extend(transitions(0, 0, 40))
    (action,) = [field for field in replay.fields if field.key == "action"]
    assert action.stored_dtype == torch.uint8 and action.stored_shape == (3,)
    assert replay.chunks[0][0]["action"].dtype == torch.uint8
    sample = replay.sample()
    assert sample["action"].dtype == torch.int64 and sample["action"].shape == (8, 5, 15)
    steps = sample["next", "obs"][..., 0].long() // 10
    assert torch.equal(sample["action"], transitions(0, 0, 40)["action"][steps])
    # an action that is not one-hot from the first write on is stored as it came
    raw = make(None, "memory", capacity=64, streams=1)
    data = transitions(0, 0, 40)
    data["action"] = data["action"].float() * 0.5
    raw.extend(data)
    assert raw.fields[0].heads == () and raw.fields[0].stored_dtype == torch.float32
    assert torch.equal(raw.sample()["action"].unique(), torch.tensor([0.0, 0.5]))
    with pytest.raises(ValueError, match="not one-hot"):
        bad = transitions(0, 40, 4)
        bad["action"][0] = 0
        replay.extend(bad)


def test_the_layout_of_the_run_spaces_sizes_one_transition():
    assert action_heads(MASKED) == (5, 4, 6)
    pov, masks = 16 * 16 * 3, (4 + 6 + 6 + 5) * 4
    assert row_bytes(MASKED) == pov + masks + 3 + 1 + 4 + 1 + 1


@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_format_1_replays_convert_to_the_same_steps_and_samples(storage, tmp_path):
    """The replay of checkpoint format 1 (torchrl storages): its state (and, for disk,
    its ring of files) resumes into today's replay with the same digest and the same
    next samples, the ring having wrapped and been written past the checkpoint."""
    old_dir, new_dir = tmp_path / "run" / "replay", tmp_path / "run" / "replay"
    old = LegacyReplay(96, 2, 8, 5, KEYS, seed=3, storage=storage, directory=old_dir)
    fill(old, 2, 0, 70)
    state, digest = old.state_dict(), old.digest()
    if storage == "disk":  # a kill -9 after the checkpoint: 10 more steps over the oldest
        old.extend(transitions(0, 70, 10))
    legacy = LegacyReplay(96, 2, 8, 5, KEYS, seed=3, storage=storage, directory=old_dir)
    legacy.load_state_dict(state)
    new = make(new_dir, storage, seed=11)
    new.load_state_dict(state)
    assert new.digest() == legacy.digest()
    if storage == "memory":
        assert new.digest() == digest
    for _ in range(5):
        a, b = new.sample(), legacy.sample()
        assert all(torch.equal(a[key], b[key]) for key in a.keys(True, True))
    # converted chunks were written: a save now holds the new layout
    new.before_checkpoint(900)
    converted = new.state_dict()
    assert converted["layout"] == replay_module.LAYOUT and "streams" not in converted
    new.after_checkpoint([900])
    if storage == "disk":  # no format-1 checkpoint older than 900 is left: the ring goes
        assert not list(new_dir.rglob("*.memmap")) and not (new_dir / "written.npy").exists()
    again = make(new_dir, storage, seed=12)
    again.load_state_dict(converted)
    assert again.digest() == new.digest()


def test_format_1_disk_ring_is_kept_while_a_format_1_checkpoint_is(tmp_path):
    directory = tmp_path / "replay"
    old = LegacyReplay(96, 2, 8, 5, KEYS, seed=3, storage="disk", directory=directory)
    fill(old, 2, 0, 30)
    state = old.state_dict()
    new = make(directory, "disk")
    new.load_state_dict(state)
    new.before_checkpoint(300)
    new.state_dict()
    new.after_checkpoint([200, 300])  # the format-1 checkpoint at 200 is still kept
    assert list(directory.rglob("*.memmap")) and (directory / "written.npy").exists()
    new.before_checkpoint(400)
    new.state_dict()
    new.after_checkpoint([300, 400])
    assert not list(directory.rglob("*.memmap"))


def test_a_format_1_disk_checkpoint_without_its_files_is_refused_in_one_line(tmp_path):
    old = LegacyReplay(96, 2, 8, 5, KEYS, seed=3, storage="disk", directory=tmp_path / "a")
    fill(old, 2, 0, 30)
    new = make(tmp_path / "b", "disk")
    with pytest.raises(checkpoint.CheckpointError, match="written.npy: missing") as error:
        new.load_state_dict(old.state_dict())
    assert "\n" not in str(error.value) and "run.from_checkpoint" in str(error.value)


@pytest.mark.parametrize("damage", ["missing", "cut"])
def test_a_missing_or_cut_replay_file_is_refused_naming_it(damage, tmp_path):
    replay = make(tmp_path / "r", "memory")
    fill(replay, 2, 0, 40)
    state = replay.state_dict()
    path = tmp_path / "r" / "stream1" / f"chunk-{16:012d}.pt"
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(checkpoint.CheckpointError) as error:
        make(tmp_path / "r", "memory").load_state_dict(state)
    assert str(error.value).startswith(str(path)) and "\n" not in str(error.value)


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_chunk_write_on_a_full_disk(tmp_path, monkeypatch):
    """disk: the run stops (``OutputError``, one line); memory: the chunk stays in RAM
    and the next checkpoint writes it, failing (``CheckpointError``) while it cannot."""
    for storage in ("disk", "memory"):
        replay = make(tmp_path / storage, storage)
        fill(replay, 2, 0, 10)
        with monkeypatch.context() as patch:
            patch.setattr(replay_files, "write_file", full_disk)
            if storage == "disk":
                with pytest.raises(OutputError, match="No space left on device") as error:
                    fill(replay, 2, 10, 20)
                assert str(error.value).startswith("replay: ") and "\n" not in str(error.value)
                continue
            fill(replay, 2, 10, 20)  # chunk 0 completes: its write fails, it is kept
            assert replay.files.unwritten[0] == {0}
            replay.before_checkpoint(100)
            with pytest.raises(checkpoint.CheckpointError, match="No space left") as error:
                replay.state_dict()
            assert str(error.value).startswith("checkpoint at step 100 not written: replay:")
        state, digest = replay.state_dict(), replay.digest()  # room again
        assert not replay.files.unwritten[0]
        restored = make(tmp_path / storage, storage)
        restored.load_state_dict(state)
        assert restored.digest() == digest


def test_a_capacity_the_machine_cannot_hold_is_refused(tmp_path, monkeypatch):
    replay = make(tmp_path / "r", "memory", capacity=1_000_000)
    replay.check_room(1_000_000, 1000)  # 1 GB: fits
    monkeypatch.setattr(replay_module, "memory_limit", lambda: 10**8)
    with pytest.raises(ConfigError, match=r"replay.size: 1,000,000 transitions .* of RAM"):
        replay.check_room(10**9, 1000)
    replay.check_room(50_000, 1000)  # a run of 50k steps fills 50 MB of it
    disk = make(tmp_path / "d", "disk", capacity=10**9)
    disk.check_room(10**9, 1)  # 1 GB in files: a disk replay needs no RAM for it
    with pytest.raises(ConfigError, match=r"replay.size: .* on disk under"):
        disk.check_room(10**9, 10**6)


def test_a_fresh_start_removes_what_an_earlier_start_left(tmp_path):
    replay = make(tmp_path / "r", "disk")
    fill(replay, 2, 0, 40)  # a run killed before its first checkpoint
    np.save(tmp_path / "r" / "written.npy", np.zeros(2))
    again = make(tmp_path / "r", "disk")
    fill(again, 2, 0, 3)
    assert files(tmp_path / "r") == {}, "stale chunks of the killed run left"
    assert len(again) == 6


def test_checkpoints_of_format_1_load_for_their_weights_and_others_are_refused(tmp_path):
    state = {"learner": {}, "config": {}, "steps": {"env_steps": 5}}
    for number in (1, 2):
        path = tmp_path / f"{number}.pt"
        content = {**state, "format": number}
        torch.save(content | {"checksum": checkpoint.checksum(content)}, path)
        assert checkpoint.load(path)["format"] == number
    content = {**state, "format": 3}
    torch.save(content | {"checksum": checkpoint.checksum(content)}, tmp_path / "3.pt")
    with pytest.raises(checkpoint.CheckpointError, match="format 3; this dreamer reads formats"):
        checkpoint.load(tmp_path / "3.pt")
