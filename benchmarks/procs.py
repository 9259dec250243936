"""A real run's processes and files, for the benchmarks and the tests alike (tests/runs.py
imports these; nothing here imports tests/)."""

from __future__ import annotations

import contextlib
import os
import platform
import struct
import subprocess
import zipfile
from pathlib import Path

from dreamer.runtime.files import jsonl_rows  # noqa: F401 - the tests' and benchmarks' reader

# A run that lasts until the caller has done what it came to do, then stops it (USR1):
# no machine is fast enough to finish it first.
UNTIL_STOPPED = "run.steps=1000000000"


def cpu_model() -> str:
    """The CPU as results files record their machine: /proc/cpuinfo's model name, family
    and model, and its bf16 instructions, e.g. ``AMD EPYC (family 25 model 1, no bf16)``:
    a VM's model name alone ("AMD EPYC") leaves Zen 2, 3 and 4 apart by 2x in speed."""
    with contextlib.suppress(OSError):
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not line.strip():
                break  # the first processor's fields
            fields.setdefault(key.strip(), value.strip())
        flags = set(fields.get("flags", "").split())
        bf16 = [flag for flag in ("avx512_bf16", "amx_bf16") if flag in flags] or ["no bf16"]
        name, family, model = (
            fields.get(key, "?") for key in ("model name", "cpu family", "model")
        )
        return f"{name} (family {family} model {model}, {', '.join(bf16)})"
    return platform.processor() or platform.machine()


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (Linux /proc)."""
    found, queue = set(), [pid]
    while queue:
        for task in Path(f"/proc/{queue.pop()}/task").glob("*"):
            try:
                children = {int(child) for child in (task / "children").read_text().split()}
            except OSError:  # it exited meanwhile
                continue
            queue += children - found
            found |= children
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def fill(folder: Path, leave: int = 0) -> Path:
    """Writes ``folder/filler`` until the filesystem is full, then frees ``leave`` bytes."""
    filler = folder / "filler"
    with filler.open("wb") as handle:
        with contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * (1 << 16))
                handle.flush()
        with contextlib.suppress(OSError):
            handle.close()
    if leave:
        os.truncate(filler, max(filler.stat().st_size - leave, 0))
    return filler


def flip_a_tensor_byte(path: Path) -> None:
    """One bit flipped in the middle of the largest tensor record of a checkpoint's zip
    (stored, not compressed): the file still unpickles."""
    with zipfile.ZipFile(path) as archive:  # tensor storages are the "<name>/data/<n>" records
        tensors = [
            info for info in archive.infolist() if info.filename.split("/")[-2:-1] == ["data"]
        ]
        record = max(tensors, key=lambda info: info.file_size)
    with path.open("r+b") as handle:
        handle.seek(record.header_offset + 26)  # the local header's name and extra lengths
        name_length, extra_length = struct.unpack("<HH", handle.read(4))
        middle = record.header_offset + 30 + name_length + extra_length + record.file_size // 2
        handle.seek(middle)
        byte = handle.read(1)[0]
        handle.seek(middle)
        handle.write(bytes([byte ^ 0x10]))


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
