"""The forkserver the run's worker processes are forked from, itself forked from the
driver (``start_forkserver``), and the env's check at launch (``check_env``)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import signal
import socket
import sys
import threading
import traceback
from multiprocessing import connection, forkserver, util

from dreamer.envs import registry
from dreamer.runtime import signals
from dreamer.runtime.signals import children_keep_signals

COLLECT = "dreamer.data.collect"  # torchrl's collector, the env maker, the acting policy


def forkserver_preload(env_name: str) -> list[str]:
    """What the env workers and the inference process run, imported once by their
    forkserver, then the freeze of that heap (pandas comes with the fork: ``import_shared``)."""
    kind = registry.kind(env_name)
    return [
        COLLECT,
        kind.module,
        *([kind.package] if kind.package else []),
        *([kind.preload] if kind.preload else []),
        "dreamer.runtime.forkserver_heap",
    ]


def import_shared() -> None:
    """pandas, where installed, imported once by the driver before it forks the forkserver:
    tensordict's ``from_any`` imports it at every process's first ``spec.zero()`` (the
    driver's env probe, each env worker's first steps), ~0.5-0.8 s of CPU each on a Zen 3
    and ~31 MB of private memory per worker; forked, they share the driver's."""
    if importlib.util.find_spec("pandas"):
        import pandas  # noqa: F401


def check_env(cfg) -> None:
    """Refuse in one line an env this machine cannot run, and prepare what the workers
    inherit (DMC's ``MUJOCO_GL``), before the driver imports torch."""
    kind = registry.kind(cfg.env.name)
    kind.install_extra(cfg.env)
    kind.check(cfg.env)


def start_forkserver(cfg) -> None:
    """Start the run's forkserver, forked from this process, which has imported torch and
    torchrl (a spawned one imported them again: ~3 s of CPU per run). It and its children
    die with the run."""
    import_shared()
    # torchrl starts the evaluation's process with the global start method, which its
    # import set to spawn (torch imported anew, ~3 s); fork's copy outlived a killed driver
    multiprocessing.set_start_method("forkserver", force=True)
    with children_keep_signals(stopped=True):
        _fork_forkserver(forkserver_preload(cfg.env.name))


def serving() -> bool:
    """Whether the run's forkserver serves this process: it dies with the run, where one
    multiprocessing starts outlives a killed owner while its children hold its pipe."""
    pid = forkserver._forkserver._forkserver_pid
    return pid is not None and pid == _forked.get("pid")


_forked: dict[str, int] = {}  # the pid of the forkserver this process forked


def _fork_forkserver(preload: list[str]) -> None:
    """``multiprocessing.forkserver.ensure_running`` forking this process, not a new
    interpreter, into CPython's private ``ForkServer`` fields (3.11, 3.12); a no-op while
    one runs. Call inside ``children_keep_signals``: it starts the resource tracker."""
    server = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            if not os.waitpid(server._forkserver_pid, os.WNOHANG)[0]:
                return
            os.close(server._forkserver_alive_fd)
        address = connection.arbitrary_address("AF_UNIX")
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # its EOF: every client process is gone
            sys.stdout.flush()  # else the child's copy of the buffers is written again
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _serve(listener.fileno(), alive_r, alive_w, preload)
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = _forked["pid"] = pid


def _serve(listener_fd: int, alive_r: int, alive_w: int, preload: list[str]) -> None:
    """The forked forkserver: the driver's signal handlers, stop hook and finalizers
    dropped, then multiprocessing's loop; it exits without the driver's atexit handlers."""
    code = 0
    try:
        os.close(alive_w)
        forkserver._forkserver._lock = threading.Lock()  # held by the forking thread
        for signum in signal.valid_signals():
            handler = signal.getsignal(signum)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(signum, signal.SIG_DFL)  # ignored signals stay ignored
        signals.forget_stop_moment()
        util._finalizer_registry.clear()
        util._run_after_forkers()
        forkserver.main(listener_fd, alive_r, preload)
    except SystemExit:
        pass  # the driver is gone
    except BaseException:  # noqa: BLE001 - said, and the run's collector start fails
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)
