"""No process a test starts outlives it: the suite's process guard (tests/conftest.py).

Every process a test starts is found in one of two ways, whatever it did since: it lies
below the test's own process (/proc's children), or its environment carries the test's
mark (``TEST_MARK``), which every process started while the test runs inherits, even one
that moved to a session of its own, was orphaned or was started by a daemon (a SLURM
job gets the environment of its ``sbatch``). Processes of the whole session (a module's
SLURM cluster, the xdist workers) carry ``SESSION_MARK`` alone.

At a test's end, what it left is given a grace period to exit, then killed with its
process group; a test that passed yet left something fails for it. At the session's end
anything with the session's mark still alive fails the suite the same way."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests import zygote
from tests.runs import alive, command_line, descendants, parent

SESSION_MARK = "DREAMER_TEST_SESSION"
TEST_MARK = "DREAMER_TEST"
# s a test's processes get to end on their own (a stopped trainer checkpoints)
GRACE = float(os.environ.get("DREAMER_TEST_GRACE", 30))
# Helpers the interpreter keeps for its whole life once something used them: children of
# the test process itself, gone when it exits (the session check sees them go).
INTERPRETER_HELPERS = (
    "multiprocessing.resource_tracker",
    "multiprocessing.forkserver",
    "torch/_inductor/compile_worker",
    "wandb/bin/wandb-core",  # wandb's service, until the process that started it exits
)


# processes a module's fixture started from inside a test (a shared server started on
# first use), with what they start: the session's check ends them, not the test's
KEPT: set[int] = set()


def keep(pid: int) -> None:
    """``pid`` serves the module, not the test that happened to start it."""
    KEPT.add(pid)


def environment(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def marked(name: str, value: str) -> set[int]:
    """Live processes whose environment holds ``name=value``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and environment(int(entry.name)).get(name) == value:
            found.add(int(entry.name))
    return {pid for pid in found if alive(pid)}


def helper(pid: int) -> bool:
    """One of this process's own interpreter helpers (kept for its life, by design): a
    spawned one, the collector's forkserver that a run inside this process forked from
    it (``dreamer.data.forkserver``), or the zygote the runs fork from (tests/zygote.py)."""
    from multiprocessing import forkserver

    return parent(pid) == os.getpid() and (
        any(name in command_line(pid) for name in INTERPRETER_HELPERS)
        or pid in (forkserver._forkserver._forkserver_pid, zygote.pid())
    )


def ancestors(pid: int) -> list[int]:
    chain = []
    while (pid := parent(pid)) > 1:
        chain.append(pid)
    return chain


def started_by_the_test(pid: int, before: set[int]) -> bool:
    """Not below a process that was there before the test (a module's server forks
    workers of its own when it likes; the zygote, which forks the test's runs, aside),
    nor one of this process's own helpers."""
    return not helper(pid) and not (set(ancestors(pid)) - {zygote.pid()}) & before


def owned(mark: str | None) -> set[int]:
    """What this process started (below it, or carrying ``mark``), not itself."""
    pids = {pid for pid in descendants(os.getpid()) if alive(pid)}
    if mark is not None:
        pids |= marked(TEST_MARK, mark)
    return pids - {os.getpid()}


def end(pids: set[int], grace: float) -> dict[int, str]:
    """Waits up to ``grace`` s for ``pids`` to exit, then SIGKILLs each one still alive
    and the process group it leads; the ones killed, with their command lines."""
    deadline = time.monotonic() + grace
    while (left := {pid for pid in pids if alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = {pid: command_line(pid) for pid in left}
    for pid in left:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in left:  # reap our own children, so they do not stay as zombies
        if parent(pid) == os.getpid():
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return killed


def describe(killed: dict[int, str]) -> str:
    return "\n".join(f"  {pid}: {command[:200]}" for pid, command in sorted(killed.items()))
