"""``replay.storage=disk``: resident memory stays flat while 48k 64x64 images go in (562 MB;
it grew by ~74 MB at 48k and at 100k, in memory by the data's size)."""

import subprocess
import sys

import pytest

SCRIPT = """
import re, sys, torch
from tensordict import TensorDict
from dreamer.data.replay import SequenceReplay

def rss_mb():
    status = open("/proc/self/status").read()
    fields = ("RssAnon", "RssFile")
    return [int(re.search(k + r":\\s+(\\d+)", status).group(1)) // 1024 for k in fields]

storage, directory, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
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
print(anon_after - anon_before, file_after)
"""


STEPS = 48_000


def grow(storage: str, directory) -> tuple[int, int]:
    """(private resident MB added by STEPS image steps, file-backed resident MB)."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, storage, str(directory), str(STEPS)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    anon, file_backed = map(int, result.stdout.splitlines()[-1].split())  # torchrl logs first
    print(f"replay.storage={storage}: +{anon} MB private resident, {file_backed} MB file-backed")
    return anon, file_backed


@pytest.mark.slow
def test_disk_storage_keeps_resident_memory_flat(tmp_path):
    data_mb = STEPS * 64 * 64 * 3 / 2**20  # 562 MB of images
    memory_anon, _ = grow("memory", tmp_path / "unused")
    disk_anon, _ = grow("disk", tmp_path / "replay")
    assert memory_anon > 0.9 * data_mb  # the control: in memory, replay is resident
    assert disk_anon < 150, f"disk replay grew private memory by {disk_anon} MB"
    # the completed chunks' files (each worker's last, open chunk is not written yet)
    files = sum(f.stat().st_size for f in (tmp_path / "replay").rglob("chunk-*.pt"))
    assert files >= 4 * (STEPS // 4 // 1024) * 1024 * 64 * 64 * 3
