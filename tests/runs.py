"""The real trainer from tests: start it, watch it, kill it, read what it wrote. The one
set of process helpers for the run, kill, death and resume tests; those a benchmark needs
too (UNTIL_STOPPED, alive, descendants, ...) live in benchmarks/procs.py. A run is forked
from an interpreter that imported the trainer (tests/zygote.py) where it starts the same."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from benchmarks.procs import (  # noqa: F401  (the tests import them from here)
    UNTIL_STOPPED,
    alive,
    command_line,
    descendants,
    fill,
    flip_a_tensor_byte,
    jsonl_rows,
    mount_tmpfs,
)
from tests import zygote

ROOT = Path(__file__).resolve().parent.parent
# The one preset of the tests that run the trainer for its machinery, not its learning:
# the smoke run on the cue task (no simulator), metrics rows every 100 env steps from
# step 200, few updates (train ratio 4). Tests add what they are about.
QUICK = (
    "experiment=smoke",
    "env=cue",
    "run.train_starts=200",
    "run.log_every=100",
    "run.train_ratio=4",
)


def trainer_arguments(logdir: Path, *overrides: str, progress: bool = False) -> list[str]:
    """``dreamer.train``'s command line with ``overrides``, writing to ``logdir``, without
    a progress bar unless asked."""
    return [*overrides, f"run.logdir={logdir}", f"run.progress={str(progress).lower()}"]


def trainer_command(logdir: Path, *overrides: str, progress: bool = False) -> list[str]:
    """``python -m dreamer.train`` with ``trainer_arguments``."""
    return [
        sys.executable,
        "-m",
        "dreamer.train",
        *trainer_arguments(logdir, *overrides, progress=progress),
    ]


# what a make above the suite hands every make below it: a user's shell has none of them
MAKE_VARIABLES = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")


def as_a_user() -> dict[str, str]:
    """This environment as a user's shell has it, for a make the test runs as they type it:
    without ``MAKE_VARIABLES`` and the variables a ``make test ARGS=...`` above the suite
    defined on its command line (make exports them, and lists them in ``MAKEFLAGS`` after
    ``--``, a space in a value escaped)."""
    _, _, defined = os.environ.get("MAKEFLAGS", "").partition("-- ")
    handed = {word.split("=", 1)[0] for word in re.split(r"(?<!\\) ", defined) if "=" in word}
    return {k: v for k, v in os.environ.items() if k not in {*MAKE_VARIABLES, *handed}}


def run_trainer(
    logdir: Path, *overrides: str, timeout: float = 600, preexec_fn=None, progress: bool = False
) -> subprocess.CompletedProcess:
    """The trainer run to its end; its output captured."""
    if preexec_fn is None:
        return run_module(
            "dreamer.train",
            *trainer_arguments(logdir, *overrides, progress=progress),
            timeout=timeout,
        )
    return subprocess.run(
        trainer_command(logdir, *overrides, progress=progress),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec_fn,
    )


def run_module(
    module: str, *arguments: str, cwd: Path = ROOT, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m module arguments`` in ``cwd``, to its end; its output captured. Forked
    from the zygote where it would start the same (tests/zygote.py)."""
    if zygote.forkable(module, list(arguments), None):
        return zygote.run(module, list(arguments), cwd=cwd, timeout=timeout)
    return subprocess.run(
        [sys.executable, "-m", module, *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(
    condition: Callable[[], object],
    what: str,
    timeout: float = 300,
    running: Trainer | None = None,
    interval: float = 0.2,
):
    """Poll ``condition`` until it is truthy (returned); fails past ``timeout`` or when
    the ``running`` trainer exits first, with the end of its log."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if running is not None:
            assert running.process.poll() is None, f"exited before {what}:\n{running.tail()}"
        tail = running.tail() if running is not None else ""
        assert time.monotonic() < deadline, f"no {what} in {timeout} s\n{tail}"
        time.sleep(interval)
    return found


class Trainer:
    """The trainer in the background, stdout and stderr in one log file.

    ``session``: in a session (and process group) of its own; ``ignore_usr1``: USR1
    ignored, as slurm/node.sh starts it; ``interruptible``: SIGINT as a terminal's
    foreground job gets it (a suite started in the background ignores it, and so would
    the trainer); ``env``: extra environment variables."""

    def __init__(
        self,
        logdir: Path,
        *overrides: str,
        log: Path,
        session: bool = False,
        ignore_usr1: bool = False,
        interruptible: bool = False,
        env: dict[str, str] | None = None,
    ):
        def prepare() -> None:
            if ignore_usr1:
                signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            if interruptible:
                signal.signal(signal.SIGINT, signal.SIG_DFL)

        self.logdir, self.log = logdir, log
        arguments = trainer_arguments(logdir, *overrides)
        if zygote.forkable("dreamer.train", arguments, env):
            log.write_text("")
            self.process = zygote.start(
                "dreamer.train",
                arguments,
                log,
                env=env,
                session=session,
                ignore_usr1=ignore_usr1,
                interruptible=interruptible,
            )
            return
        with log.open("w") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dreamer.train", *arguments],
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=session,
                env={**os.environ, **env} if env else None,
                preexec_fn=prepare if ignore_usr1 or interruptible else None,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text()

    def tail(self, characters: int = 4000) -> str:
        return self.text()[-characters:]

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 300) -> str:
        """The ``count``-th match of ``pattern`` in the log (its first group, if any)."""
        found = wait_until(
            lambda: re.findall(pattern, self.text())[count - 1 : count] or None,
            repr(pattern),
            timeout,
            self,
        )
        return found[0]

    def wait_rows(self, count: int = 1, past: int = -1, timeout: float = 300) -> list[dict]:
        """Its training rows once ``count`` of them lie past env step ``past``."""

        def enough() -> list[dict] | None:
            rows = read_metrics(self.logdir, live=True)
            return rows if sum(row["env_steps"] > past for row in rows) >= count else None

        return wait_until(enough, f"{count} metrics rows past env step {past}", timeout, self)

    def wait_updates(self, timeout: float = 300) -> list[dict]:
        """Its training rows once one shows a learner update: training is under way."""

        def begun() -> list[dict] | None:
            return training(read_metrics(self.logdir, live=True))

        return wait_until(begun, "a metrics row after an update", timeout, self)

    def kill(self) -> set[int]:
        """SIGKILL the trainer alone (its children are left to notice); returns them."""
        children = descendants(self.pid)
        os.kill(self.pid, signal.SIGKILL)
        return children

    def wait(self, timeout: float = 600) -> int:
        """Its exit code (a negative signal number if a signal ended it)."""
        return self.process.wait(timeout)

    def stop(self, timeout: float = 300) -> int:
        """USR1 (a preemption): it checkpoints and exits; its exit code."""
        self.process.send_signal(signal.SIGUSR1)
        return self.wait(timeout)


def training(rows: list[dict]) -> list[dict] | None:
    """``rows`` once one of them shows a learner update, else None."""
    return rows if any(row.get("updates", 0) > 0 for row in rows) else None


def read_metrics(logdir: Path, which: str = "train", live: bool = False) -> list[dict]:
    """metrics.jsonl's training rows, its evaluation rows (``which="eval"``) or all.
    ``live``: the run may still be writing (no file yet, a last line half written)."""
    path = logdir / "metrics.jsonl"
    if live and not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except ValueError:
            if not (live and number == len(lines)):
                raise
    if which == "all":
        return rows
    return [row for row in rows if ("eval/return" in row) == (which == "eval")]


def parent(pid: int) -> int:
    """Its parent's pid (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def all_gone(pids: Iterable[int], timeout: float = 30) -> list[int]:
    """Waits up to ``timeout`` for ``pids`` to exit; those still alive after it."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


FORKED = """
import json, os, sys
sys.path.insert(1, sys.argv[5])  # the repository: tests.zygote (the cwd may be elsewhere)
exec(sys.argv[4])  # the prelude: imports every fork would otherwise pay for
from tests.zygote import become, command
module, out = sys.argv[1], sys.argv[2]
for i, (argv, hidden) in enumerate(json.loads(sys.argv[3])):
    pid = os.fork()
    if pid == 0:
        become(command(module, argv, f"{out}/{i}.out", f"{out}/{i}.err", os.getcwd(),
                       hidden=hidden))
    _, status = os.waitpid(pid, 0)
    with open(os.path.join(out, f"{i}.rc"), "w") as rc:
        rc.write(str(os.waitstatus_to_exitcode(status)))
"""


def forked_runs(
    module: str,
    rows: list[tuple[list[str], list[str]]],
    out: Path,
    cwd: Path = ROOT,
    prelude: str | None = None,
    timeout: float = 300,
) -> list[subprocess.CompletedProcess]:
    """``python -m module`` once per row (arguments, modules hidden as if not installed),
    each in a process of its own, one after another, forked from the zygote (which
    imported the commands: tests/zygote.py), or with ``prelude`` (a test's own patches,
    which the shared zygote cannot take) from an interpreter that ran it once, writing
    into ``out``: dozens of fresh interpreters importing torch cost minutes on 2 cores.
    For runs that end before they build anything (a refusal): a DMC row is forked too.
    Their exit codes and output, as ``subprocess.run`` would give them."""
    if prelude is None:
        deadline = time.monotonic() + timeout
        return [
            zygote.run(module, argv, cwd, max(deadline - time.monotonic(), 0), hidden)
            for argv, hidden in rows
        ]
    subprocess.run(
        [sys.executable, "-c", FORKED, module, str(out), json.dumps(rows), prelude, str(ROOT)],
        cwd=cwd,
        timeout=timeout,
    )
    done = []
    for i, (argv, _) in enumerate(rows):
        rc = out / f"{i}.rc"
        stdout, stderr = ((out / f"{i}.{stream}").read_text() for stream in ("out", "err"))
        done.append(
            subprocess.CompletedProcess(
                argv, int(rc.read_text()) if rc.exists() else None, stdout, stderr
            )  # fmt: skip
        )
    return done


def signal_mask(pid: int, field: str) -> int:
    """A signal mask of process ``pid`` from /proc/<pid>/status: ``SigIgn`` (ignored),
    ``SigBlk`` (blocked), ``ShdPnd`` (pending for the whole process); signal n is bit n-1."""
    fields = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields[field], 16)


def ignores_usr1(pid: int) -> bool:
    """Is USR1 ignored or blocked in process ``pid`` (Linux /proc)?"""
    bit = 1 << (signal.SIGUSR1 - 1)
    return bool((signal_mask(pid, "SigIgn") | signal_mask(pid, "SigBlk")) & bit)


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of ``size`` (e.g. ``64m``) mounted at ``path`` for the block."""
    mount_tmpfs(path, size)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def can_mount_tmpfs() -> bool:
    """Can this process mount a tmpfs (root with CAP_SYS_ADMIN, as on these machines)?"""
    import tempfile

    if os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory() as point:
        try:
            with tmpfs(Path(point), "1m"):
                return True
        except subprocess.CalledProcessError:
            return False


def venv_without(folder: Path, *hidden: str) -> Path:
    """A new venv (its python returned) that has this one's packages but ``hidden`` (top
    level names, with their dist-info): each entry of this venv's site-packages linked
    into its own, so that a pip install there writes only into the new venv."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", folder], check=True)
    python = folder / "bin" / "python"
    target = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.split("-")[0].lower()
        if name not in hidden and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)
    return python
