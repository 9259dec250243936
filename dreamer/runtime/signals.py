"""How a run stops and says so: ``StopSignals`` turns SIGTERM/SIGUSR1 (SLURM's preemption
and time-limit warnings) into a checkpoint and ``REQUEUE_EXIT``; ``children_keep_signals``
gives child processes started while it is installed the handling the run's first
children got."""

from __future__ import annotations

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
    """Processes started inside (the collector's, the evaluation process, the render
    pool, and their replacements) never act on SIGINT, and ignore what the run's first
    children ignore. ``stopped``: children this process will stop (``collector.pace=stop``)
    never act on SIGHUP either: when the shell that started the run exits (a launcher
    script that backgrounds it) while they are stopped, they are the stopped members of an
    orphaned process group, which the kernel hangs up (SIGHUP, then SIGCONT), and the run
    lost its collector to it. They die with the driver instead (``die_with_parent``).

    The first children start before ``StopSignals`` and inherit SIG_IGN for what the
    launcher ignores (USR1 under SLURM, which signals every process of the job step).
    Later ones would start with the default action (exec resets the handler), and a
    preemption would kill them before the checkpoint. Changing the disposition around a
    start would lose a signal arriving meanwhile, so these signals are blocked in the
    starting thread instead: the children (and their threads) inherit the blocked mask,
    so they never act on them, and this process takes a pending one when the mask is
    restored."""
    # multiprocessing's resource tracker, started by the first child, unblocks SIGINT
    # and SIGTERM in the starting thread (SIG_UNBLOCK, not the mask it found): started
    # inside, it let the children after it act on Ctrl-C
    resource_tracker.ensure_running()
    stop = StopSignals.installed
    # Ctrl-C reaches the terminal's whole process group: the driver stops the run and
    # ends its children, which would otherwise each print a KeyboardInterrupt traceback
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
    """Ctrl-C inside the block raises KeyboardInterrupt at its end, a second one at once.
    Around the learner's update: an interrupt between its optimizers' steps (or while the
    slow critic's weights sit in the critic) would checkpoint half an update. Where
    Ctrl-C does not raise KeyboardInterrupt (ignored in a background job, or outside the
    main thread), nothing changes."""
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
    """At a run's start, before it starts a child: ``DREAMER_STOP_AT`` is read by the
    run's process and taken out of the environment its children get."""
    global _stop_at
    _stop_at = os.environ.pop(STOP_AT, _stop_at)


def forget_stop_moment() -> None:
    """In a child forked from the run's process: ``DREAMER_STOP_AT`` is the run's alone."""
    global _stop_at
    _stop_at = ""


def stop_moment(name: str) -> None:
    """A moment where a stop is hardest to get right: a child process starting while
    this thread blocks SIGINT, a checkpoint or replay file half written. With
    ``DREAMER_STOP_AT=name[:SIGNAL[:N]]`` the run stops itself the
    N-th time (default: the first) it comes to ``name``, once: SIGINT by default, to its
    whole process group as a terminal's Ctrl-C (or SIGTERM, SIGUSR1: a scheduler's);
    SIGKILL to this process alone, as ``kill -9`` or the OOM killer (its children are
    left to notice). Tests stop a run at each such moment this way, not at a random one."""
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
    """SIGKILL this process when its parent exits (Linux ``PR_SET_PDEATHSIG``; SIGKILL is
    the one signal a stopped process acts on). The collector's forkserver dies with the
    driver, and each process it forks with the forkserver: the env workers and the
    inference process that ``collector.pace=stop`` holds stopped cannot run torchrl's
    own watch for the driver, and the forkserver would not see the driver go while they
    hold its pipe."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # the parent was gone before the call: this process was handed to init, or to a
        # subreaper (systemd --user, tini, a container's init), whose pid is not 1
        if os.getppid() == 1 or (_forked_by and os.getppid() != _forked_by):
            os.kill(os.getpid(), signal.SIGKILL)


def quiet_handshake_resets() -> None:
    """multiprocessing's resource sharer (a thread of this process that hands file
    descriptors to starting children) prints a traceback through ``sys.excepthook`` when
    a child goes while it connects: at a stop the run ends its children, one of which
    may be starting (seen once after a Ctrl-C). Such a reset is a debug line, not a
    traceback; every other exception reaches the hook it had."""
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
    """With ``DREAMER_TERMINAL_JOB=1`` (the Makefile's run targets), the run is a job of
    its own on the terminal, as a shell makes a command it starts: its own process group,
    the terminal's foreground one. Ctrl-C then reaches the run alone, not make, which
    printed ``make: *** [...] Interrupt`` below the run's resume line. The terminal goes
    back to the group it came from on exit (a shell takes it back after a kill).

    As a shell does for its foreground job, Ctrl-C is taken again where it came ignored:
    a make started by a script in the background (or a suite run with ``&``) passes
    SIGINT ignored down to the run, which then held the terminal and lost every Ctrl-C
    typed at it."""
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
