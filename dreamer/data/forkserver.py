"""The forkserver the collector's env workers, its inference process, the evaluation
process and the render workers are forked from: what it imports before forking
(``forkserver_preload``), the env's check at launch (``check_env``), and the
forkserver's start (``start_forkserver``), forked from the driver once the driver has
imported torch, torchrl and the collector.
"""

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
    forkserver: the collector's module, the env kind's module, its simulator package and
    what building an env imports from it, pandas where it is installed, then the freeze
    of that heap.

    pandas: tensordict's ``TensorDict.from_any`` imports it (and with it pyarrow) at the
    first dict it converts, which every env worker does at its first steps; imported
    there, after the fork, it cost each of them ~31 MB of private memory."""
    kind = registry.kind(env_name)
    return [
        COLLECT,
        kind.module,
        *([kind.package] if kind.package else []),
        *([kind.preload] if kind.preload else []),
        *(["pandas"] if importlib.util.find_spec("pandas") else []),
        "dreamer.runtime.forkserver_heap",
    ]


def check_env(cfg) -> None:
    """What the env kind asks of the machine, at launch, before the driver imports torch
    (under make, after installing the extra it lacks: ``registry.INSTALL_EXTRAS``): an
    env the machine cannot run is refused in one line, and the environment the workers
    inherit is prepared (DMC's ``MUJOCO_GL``, which dm_control reads once, when the
    forkserver imports it)."""
    kind = registry.kind(cfg.env.name)
    kind.install_extra(cfg.env)
    kind.check(cfg.env)


def start_forkserver(cfg) -> None:
    """Start the run's forkserver, forked from this process, which has imported what the
    env workers and the inference process run but the env's own modules (the forkserver
    imports those: ``forkserver_preload``). A forkserver spawned at launch imported
    torch and torchrl again, in parallel with this process: ~3 s of CPU more per run for
    the same first env step. A collector that groups envs (``collector.envs_per_worker >
    1``) forks none. Started with SIGINT blocked, as every child of the run, and SIGHUP
    (what a paced collection needs of its processes: ``children_keep_signals``); it and
    its children die with the run (``forkserver_heap``)."""
    if cfg.collector.envs_per_worker > 1:
        return
    # torchrl starts its own processes (the evaluation's) with the global start method,
    # which its import set to spawn where none was set: spawn imported torch and torchrl
    # anew in the evaluation process (~3 s of CPU at each run's first evaluation; fork
    # copied the driver into one that outlived a killed driver); from this forkserver
    # it finds them imported
    multiprocessing.set_start_method("forkserver", force=True)
    with children_keep_signals(stopped=True):
        _fork_forkserver(forkserver_preload(cfg.env.name))


def serving() -> bool:
    """Whether the run's forkserver (``start_forkserver``) serves this process: it dies
    with the run, and its children with it. A forkserver multiprocessing starts itself
    lives on while its children hold its pipe: a killed owner's would not end them."""
    pid = forkserver._forkserver._forkserver_pid
    return pid is not None and pid == _forked.get("pid")


_forked: dict[str, int] = {}  # the pid of the forkserver this process forked


def _fork_forkserver(preload: list[str]) -> None:
    """``multiprocessing.forkserver.ensure_running`` with ``os.fork`` of this process in
    place of a new interpreter: the same listener socket, "alive" pipe and
    ``forkserver.main`` loop, recorded in the same (private) fields of CPython's
    ``ForkServer``, 3.11 and 3.12 alike. A no-op while one runs (a sweep's next job).
    Called inside ``children_keep_signals``, which starts the resource tracker first."""
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
    """The forked forkserver: rid of what was the driver's (its signal handlers, its
    stop hook, multiprocessing's finalizers), then multiprocessing's own loop; it exits
    without the driver's atexit handlers."""
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
