"""``replay.storage=disk``: resident memory stays flat while 24k 64x64 images go in (281 MB;
it grew by ~74 MB at 48k and at 100k, in memory by the data's size)."""

import subprocess
import sys

import pytest

# one interpreter imports the replay once; each storage fills a replay in a child forked
# from it (before any replay exists), whose growth is measured from its own start
SCRIPT = """
import os, re, sys, torch
from tensordict import TensorDict
from dreamer.data.replay import SequenceReplay

def rss_mb():
    status = open("/proc/self/status").read()
    fields = ("RssAnon", "RssFile")
    return [int(re.search(k + r":\\s+(\\d+)", status).group(1)) // 1024 for k in fields]

def grow(storage, directory, steps):
    replay = SequenceReplay(steps, 4, batch=16, length=64, keys=["is_init", ("next", "pixels")],
                            storage=storage, directory=directory)
    pixels = torch.randint(0, 255, (1000, 64, 64, 3), dtype=torch.uint8)
    anon_before, _ = rss_mb()
    for index in range(steps // 1000):
        replay.extend(TensorDict({
            "env_index": torch.full((1000,), index % 4),
            "is_init": torch.zeros(1000, 1, dtype=torch.bool),
            "next": {"pixels": pixels},
        }, [1000]))
    anon_after, file_after = rss_mb()
    assert len(replay) == steps and replay.sample()["next", "pixels"].shape == (16, 64, 64, 64, 3)
    print(storage, anon_after - anon_before, file_after, flush=True)

steps = int(sys.argv[1])
for storage, directory in zip(("memory", "disk"), sys.argv[2:]):
    child = os.fork()
    if child == 0:
        grow(storage, directory, steps)
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0, storage
"""


STEPS = 24_000


@pytest.mark.slow
def test_disk_storage_keeps_resident_memory_flat(tmp_path):
    folders = [str(tmp_path / "unused"), str(tmp_path / "replay")]
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(STEPS), *folders],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # private resident MB each storage added with STEPS image steps (torchrl logs first)
    grew = {line.split()[0]: int(line.split()[1]) for line in result.stdout.splitlines()[-2:]}
    print(f"replay.storage: +{grew} MB private resident")
    data_mb = STEPS * 64 * 64 * 3 / 2**20  # 281 MB of images
    assert grew["memory"] > 0.9 * data_mb  # the control: in memory, replay is resident
    assert grew["disk"] < 150, f"disk replay grew private memory by {grew['disk']} MB"
    # the completed chunks' files (each worker's last, open chunk is not written yet)
    files = sum(f.stat().st_size for f in (tmp_path / "replay").rglob("chunk-*.pt"))
    assert files >= 4 * (STEPS // 4 // 1024) * 1024 * 64 * 64 * 3
