"""How a run stops: ``StopSignals`` turns SLURM's SIGTERM/SIGUSR1 into a checkpoint and
``REQUEUE_EXIT``; the rest keeps children's signal handling and the terminal in order."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from multiprocessing import resource_tracker

REQUEUE_EXIT = 75  # EX_TEMPFAIL: checkpointed after SIGTERM/SIGUSR1/SIGUSR2; rerun to resume
INTERRUPT_EXIT = 130  # checkpointed after Ctrl-C
STOPPED_FILE = "stopped"


def exit_now(code: int):
    """End this process with ``code`` as ``sys.exit`` would, minus the interpreter's
    finalization: its threads joined, its atexit handlers run (logging, the trackers,
    multiprocessing's children), its standard streams flushed. Tearing down torch's
    modules took ~1.3 s after a run's last line (a 2-core Zen 3)."""
    threading._shutdown()  # what the interpreter's end does first: join non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed stream
            stream.flush()
    os._exit(code)


class StopSignals:
    """Turns SIGTERM/SIGUSR1/SIGUSR2 into a flag the loop checks between updates
    (SLURM's preemption signal is USR1 in slurm/*.sbatch, USR2 from submitit)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    installed: StopSignals | None = None  # the one in effect in this process

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def __enter__(self) -> StopSignals:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        StopSignals.installed = self
        return self

    def __exit__(self, *exc) -> None:
        StopSignals.installed = None
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def ignored(self) -> list[int]:
        """The stop signals this process ignored before (slurm/node.sh ignores USR1)."""
        return [signum for signum, handler in self._previous.items() if handler == signal.SIG_IGN]


@contextlib.contextmanager
def children_keep_signals(stopped: bool = False):
    """Processes started inside never act on SIGINT, and ignore what the run's first children
    ignore (USR1 under SLURM: later ones would die of a preemption); with ``stopped``
    (``collector.pace=stop``) not SIGHUP either: the kernel hangs up an orphaned group's
    stopped members when the launching shell exits. Blocked, not ignored, so none arriving
    meanwhile is lost: children inherit the mask, this process gets it when it is restored."""
    # the resource tracker, started by the first child, unblocks SIGINT and SIGTERM in the
    # starting thread: started inside, it let the children after it act on Ctrl-C
    resource_tracker.ensure_running()
    stop = StopSignals.installed
    # Ctrl-C reaches the whole group; the driver ends the children (each would print a trace)
    blocked = [signal.SIGINT, *(stop.ignored() if stop is not None else [])]
    blocked += [signal.SIGHUP] if stopped else []
    # the mask as it is, changed inside the try: a Ctrl-C already pending raises
    # KeyboardInterrupt from the call that changes it, which would leave SIGINT blocked
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def ctrl_c_after_block():
    """Ctrl-C inside the block raises KeyboardInterrupt at its end, a second one at once (an
    update interrupted between optimizer steps would checkpoint half of it); no change where
    Ctrl-C does not raise (ignored, or outside the main thread)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    pending = False

    def hold(signum, frame) -> None:
        nonlocal pending
        if pending:
            raise KeyboardInterrupt
        pending = True

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pending:
        raise KeyboardInterrupt


STOP_AT = "DREAMER_STOP_AT"
_stop_at = ""
_moments_seen: dict[str, int] = {}


def claim_stop_moment() -> None:
    """At a run's start: take ``DREAMER_STOP_AT`` out of the environment children get."""
    global _stop_at
    _stop_at = os.environ.pop(STOP_AT, _stop_at)


def forget_stop_moment() -> None:
    """In a child forked from the run's process: ``DREAMER_STOP_AT`` is the run's alone."""
    global _stop_at
    _stop_at = ""


def stop_moment(name: str) -> None:
    """A test hook where a stop is hardest to get right: ``DREAMER_STOP_AT=name[:SIGNAL[:N]]``
    stops the run the N-th time (default 1) it comes to ``name``, once: SIGINT (default) or
    another signal to its process group, SIGKILL to this process alone."""
    global _stop_at
    wanted, _, rest = _stop_at.partition(":")
    if wanted != name:
        return
    signame, _, nth = rest.partition(":")
    _moments_seen[name] = seen = _moments_seen.get(name, 0) + 1
    if seen < int(nth or 1):
        return
    _stop_at = ""  # once
    signum = signal.Signals[signame or "SIGINT"]
    logging.getLogger("dreamer").info("%s at %s (%s)", signum.name, name, STOP_AT)
    if signum == signal.SIGKILL:
        for handler in logging.getLogger().handlers + logging.getLogger("dreamer").handlers:
            handler.flush()
        os.kill(os.getpid(), signum)
    os.killpg(os.getpgrp(), signum)


PR_SET_PDEATHSIG = 1  # prctl(2)
_forking = 0  # this process's pid, set just before it forks
_forked_by = 0  # in a forked child: the pid of the process that forked it (else 0)


def _before_fork() -> None:
    global _forking
    _forking = os.getpid()


def _in_child() -> None:
    global _forked_by
    _forked_by = _forking


os.register_at_fork(before=_before_fork, after_in_child=_in_child)


def die_with_parent() -> None:
    """SIGKILL this process when its parent exits (the one signal a stopped process acts
    on): processes ``collector.pace=stop`` holds stopped cannot watch for the driver."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # the parent already went: adopted by init or by a subreaper, whose pid is not 1
        if os.getppid() == 1 or (_forked_by and os.getppid() != _forked_by):
            os.kill(os.getpid(), signal.SIGKILL)


def quiet_handshake_resets() -> None:
    """Log as a debug line, not a traceback, the reset multiprocessing's resource sharer
    reports through ``sys.excepthook`` when a child goes while it connects (at a stop)."""
    previous = sys.excepthook
    if getattr(previous, "quiet_handshakes", False):  # installed by an earlier main()
        return

    def hook(kind, value, tb) -> None:
        frames = traceback.extract_tb(tb) if tb is not None else []
        if issubclass(kind, (ConnectionError, EOFError)) and any(
            frame.filename.endswith("resource_sharer.py") for frame in frames
        ):
            logging.getLogger("dreamer").debug("a child went during a handshake: %s", value)
            return
        previous(kind, value, tb)

    hook.quiet_handshakes = True
    sys.excepthook = hook


TERMINAL_JOB = "DREAMER_TERMINAL_JOB"


@contextlib.contextmanager
def terminal_job():
    """With ``DREAMER_TERMINAL_JOB=1`` (the Makefile's), the run is its own foreground job,
    so Ctrl-C reaches it, not make; as a shell does, it re-enables a Ctrl-C inherited ignored."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if os.environ.get(TERMINAL_JOB) != "1" or fd is None or os.tcgetpgrp(fd) != os.getpgrp():
        yield
        return
    came_from = os.getpgrp()
    os.setpgid(0, 0)
    _hand_terminal(fd, os.getpgrp())
    interrupt = signal.getsignal(signal.SIGINT)
    if interrupt == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, interrupt)
        with contextlib.suppress(OSError):  # the terminal is gone
            _hand_terminal(fd, came_from)


def _hand_terminal(fd: int, group: int) -> None:
    """Make ``group`` the terminal's foreground; a background group's own call would
    stop it (SIGTTOU) but for the signal ignored meanwhile."""
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, group)
    finally:
        signal.signal(signal.SIGTTOU, previous)
