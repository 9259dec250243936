"""Files replaced whole or not at all: the new content goes to a temporary file beside
the old one, reaches the disk (fsync), and is renamed over it; the folder is synced so
the rename survives a power loss. A failed write leaves the old file and no temporary."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

TEMPORARY = ".{name}.tmp"  # what a crash mid-write leaves (rundir removes them)


def temporary_of(path: Path) -> Path:
    return path.with_name(TEMPORARY.format(name=path.name))


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[BinaryIO]:
    """A binary handle for ``path``'s new content, which replaces it if the block succeeds."""
    temporary = temporary_of(path)
    try:
        with temporary.open("wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def replace_text(path: Path, text: str) -> None:
    with replacing(path) as handle:
        handle.write(text.encode("utf-8"))


def bytes_free(folder: Path) -> str:
    """``" (N bytes free)"`` on ``folder``'s file system, for a failed write's line (a
    library's message may not say the disk is full); ``""`` where it cannot be read."""
    try:
        return f" ({shutil.disk_usage(folder).free:,} bytes free)"
    except OSError:
        return ""


def jsonl_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines file a run may still be writing or was killed writing
    (none if it is not there yet; a line cut short is left out)."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows
