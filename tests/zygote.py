"""The tests' trainer runs forked from one interpreter that imported the trainer once.

Each ``python -m dreamer.train`` spends ~4 CPU-s importing torch, tensordict and torchrl
before it reads its command line; the suite starts ~80 of them on two cores. A zygote
per test process (``python -m tests.zygote``) imports the commands once and forks each
run from itself; the run then executes the module as ``__main__`` with its command line,
working folder, environment, signal dispositions and output files, as ``python -m``
would: only the interpreter's start and the imports are shared.

What a fork cannot give is what must be set before those imports: libgomp's spin
settings (``dreamer.runtime.openmp``, chosen from the command line), MuJoCo's renderer
(``MUJOCO_GL``, set by a DMC run before torchrl loads mujoco) and any other variable the
imports read. ``forkable`` sends such a run to a fresh interpreter instead.

The zygote is a child subreaper: what a run leaves orphaned stays below the test process,
where the suite's process guard (tests/leaks.py) finds it, as it finds a run's children
by their environment's mark when the run was started fresh."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("dreamer.train", "dreamer.evaluate", "dreamer.export", "tests.evaluate_watched")
# set DREAMER_TEST_FRESH=1 to start every run in a fresh interpreter, as before the zygote
FRESH = os.environ.get("DREAMER_TEST_FRESH") == "1"
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # prctl(2)


def forkable(module: str, arguments: list[str], env: dict[str, str] | None) -> bool:
    """Would this run start as a fresh interpreter would from the zygote's imports? Not a
    DMC run, no variable but dreamer's own ``DREAMER_*`` hooks (read when a run starts,
    never at import: tests/test_zygote.py), the same OpenMP spin choice."""
    from dreamer.runtime.openmp import gpu_learner

    return (
        not FRESH
        and module in COMMANDS
        and all(
            key.startswith("DREAMER_") or os.environ.get(key) == value
            for key, value in (env or {}).items()
        )
        and not any(
            arg.split("=", 1)[0] in ("env", "experiment") and "dmc" in arg for arg in arguments
        )
        and gpu_learner(arguments) == gpu_learner([])
    )


class Forked:
    """A run forked by the zygote, as much of ``subprocess.Popen`` as the tests use: its
    exit code is read from the file the zygote writes when it reaps it."""

    def __init__(self, pid: int, rc: Path, args: list[str]):
        self.pid, self.rc, self.args = pid, rc, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.rc.exists():
            self.returncode = int(self.rc.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


_zygote: subprocess.Popen | None = None
_lock = threading.Lock()


def pid() -> int | None:
    """The zygote's pid, once this process started it (and it still runs)."""
    return _zygote.pid if _zygote is not None and _zygote.poll() is None else None


def start(
    module: str,
    arguments: list[str],
    stdout: Path,
    stderr: Path | None = None,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    session: bool = False,
    ignore_usr1: bool = False,
    interruptible: bool = False,
    hidden: Iterable[str] = (),
) -> Forked:
    """``python -m module arguments`` forked from the zygote, its output in ``stdout``
    (and ``stderr``, else the same file), ``hidden`` modules as if not installed, exit
    code readable once it ends."""
    global _zygote
    rc = stdout.with_name(stdout.name + ".rc")
    rc.unlink(missing_ok=True)
    request = command(module, arguments, stdout, stderr, cwd, env, session, ignore_usr1, hidden)
    request |= {"rc": str(rc), "interruptible": interruptible}
    with _lock:
        if _zygote is None or _zygote.poll() is not None:
            from tests import leaks

            quiet = {k: v for k, v in os.environ.items() if k != leaks.TEST_MARK}
            _zygote = subprocess.Popen(
                [sys.executable, "-m", "tests.zygote"],
                cwd=ROOT,
                env=quiet,  # it serves the whole session, not the test that started it
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        _zygote.stdin.write(json.dumps(request) + "\n")
        _zygote.stdin.flush()
        reply = _zygote.stdout.readline()
    assert reply.strip().isdigit(), f"the zygote did not fork: {reply!r}"
    return Forked(int(reply), rc, [module, *arguments])


def command(
    module: str,
    arguments: list[str],
    stdout: Path | str,
    stderr: Path | str | None = None,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    session: bool = False,
    ignore_usr1: bool = False,
    hidden: Iterable[str] = (),
) -> dict:
    """What ``become`` makes of a forked process: ``python -m module arguments`` in ``cwd``
    with this environment and ``env``, its output in ``stdout`` (and ``stderr``, else the
    same file), ``hidden`` modules as if not installed."""
    return {
        "module": module,
        "argv": arguments,
        "cwd": str(cwd),
        "env": {**os.environ, **(env or {})},
        "stdout": str(stdout),
        "stderr": str(stderr) if stderr else None,
        "session": session,
        "ignore_usr1": ignore_usr1,
        "interruptible": False,
        "hidden": list(hidden),
    }


def become(request: dict) -> None:
    """In a process forked from an interpreter that imported the command (the zygote,
    ``runs.forked_runs``): become ``python -m module argv`` (``hidden`` modules as if not
    installed) and exit as it would."""
    import atexit
    import runpy
    import traceback

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if request["session"]:
        os.setsid()
    if request["interruptible"]:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if request["ignore_usr1"]:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = (
        os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        if request["stderr"]
        else out
    )
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    sys.argv = ["-m", *request["argv"]]
    sys.path[0] = request["cwd"]
    for name in request["hidden"]:
        sys.modules[name] = None
    code = 0
    try:
        sys.modules.pop(request["module"], None)  # python -m runs it as __main__ alone
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # Python's own end: the traceback, then death by SIGINT
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # the interpreter's end: its threads joined, then atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _serve() -> None:
    """The zygote: one JSON request per line on stdin, answered by the forked pid; each
    run's exit code written to its ``rc`` file when it is reaped."""
    import ctypes

    import dreamer.evaluate  # noqa: F401
    import dreamer.export  # noqa: F401
    import dreamer.train  # noqa: F401  (its OpenMP choice, before torch loads)
    import dreamer.training.loop  # noqa: F401
    from dreamer.command_line import load
    from dreamer.data.forkserver import import_shared

    import_shared()  # what every run imports before it forks its forkserver
    load([])  # Hydra's first composition imports and registers what every later one reuses

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # ends with the test process
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    # numpy's OpenBLAS keeps a pool thread, which its fork handlers restart in a child
    # (the run forks its own forkserver from the same imports); no thread of Python's
    assert threading.active_count() == 1, "the imports started a thread: no fork from here"
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    requests = os.fdopen(0, "r")
    runs: dict[int, str] = {}
    while True:
        ready, _, _ = select.select([requests, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
        while True:
            try:
                child, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if child == 0:
                break
            if child in runs:  # else an orphan of a run, reparented here
                rc = runs.pop(child)
                Path(rc + ".tmp").write_text(str(os.waitstatus_to_exitcode(status)))
                os.replace(rc + ".tmp", rc)
        if requests in ready:
            line = requests.readline()
            if not line:
                return
            request = json.loads(line)
            sys.stderr.flush()  # else the child's copy of its buffer is written again
            child = os.fork()
            if child == 0:
                try:
                    become(request)
                finally:
                    os._exit(1)
            runs[child] = request["rc"]
            os.write(1, f"{child}\n".encode())


def run(
    module: str,
    arguments: list[str],
    cwd: Path = ROOT,
    timeout: float | None = None,
    hidden: Iterable[str] = (),
) -> subprocess.CompletedProcess:
    """``subprocess.run([python, -m, module, *arguments], capture_output=True, text=True)``
    forked from the zygote (``hidden`` modules as if not installed): killed past
    ``timeout``, as subprocess.run kills."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="forked-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        forked = start(module, arguments, out, err, cwd=cwd, hidden=hidden)
        try:
            code = forked.wait(timeout)
        except subprocess.TimeoutExpired:
            forked.kill()
            forked.wait()
            raise
        return subprocess.CompletedProcess(
            [sys.executable, "-m", module, *arguments], code, out.read_text(), err.read_text()
        )


if __name__ == "__main__":
    _serve()
