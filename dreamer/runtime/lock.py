"""``RunLock``: one process per run directory (an OS file lock: the kernel frees it when
the holder dies, even by SIGKILL, so a stale lock file never blocks the next run)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from filelock import FileLock, Timeout


class RunLockedError(RuntimeError):
    pass


class RunLock:
    """Held for the whole run; a second process on the same directory is refused."""

    def __init__(self, logdir: Path):
        self.path = logdir / "run.lock"
        self.owner = logdir / "run.lock.owner"
        self.lock = FileLock(self.path)

    def __enter__(self) -> RunLock:
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            holder = self.owner.read_text().strip() if self.owner.exists() else "unknown"
            raise RunLockedError(
                f"run.logdir: {self.path.parent} is in use by {holder}; "
                "stop that run or choose another run.logdir"
            ) from None
        self.owner.write_text(f"pid {os.getpid()} on {socket.gethostname()}\n")
        return self

    def __exit__(self, *exc) -> None:
        self.owner.unlink(missing_ok=True)
        self.lock.release()
