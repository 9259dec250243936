"""A stopped run ends with the command that resumes it: its own command line, with
``run.logdir`` naming its run directory (a plain rerun starts a new one); that command
resumes it. Stopping prints no traceback, ERROR or WARNING from any of its processes."""

import os
import pty
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from dreamer.runtime import checkpoint, signals
from tests.runs import (
    QUICK,
    ROOT,
    UNTIL_STOPPED,
    Trainer,
    all_gone,
    as_a_user,
    descendants,
    read_metrics,
    run_module,
)


@pytest.fixture(scope="module")
def preempted(tmp_path_factory):
    """A run stopped by SIGUSR1 (a SLURM preemption; SIGTERM takes the same handler)
    past its third metrics row: its folder, exit code, log, the processes it had below it
    and a copy of its folder taken at the stop (``as_stopped``), for the tests that resume
    it another way than its own folder's test does."""
    base = tmp_path_factory.mktemp("preempted")
    logdir = base / "run"
    trainer = Trainer(logdir, *QUICK, UNTIL_STOPPED, log=base / "run.log")
    trainer.wait_rows(3)
    children = descendants(trainer.pid)
    trainer.process.send_signal(signal.SIGUSR1)
    code = trainer.wait(300)
    shutil.copytree(logdir, base / "as_stopped")
    return Preempted(logdir, code, trainer.text(), children, base / "as_stopped")


class Preempted(NamedTuple):
    logdir: Path
    code: int
    text: str
    children: set[int]
    as_stopped: Path

    def stopped_at(self) -> int:
        return checkpoint.saved_steps(self.as_stopped)[-1]


@pytest.mark.slow
def test_a_preempted_run_checkpoints_exits_for_a_requeue_and_leaves_no_process(preempted):
    assert preempted.code == signals.REQUEUE_EXIT, preempted.text[-3000:]
    assert_quiet(preempted.text)
    assert len(preempted.children) >= 3, "expected env workers and an inference process"
    assert all_gone(preempted.children, timeout=5) == [], "orphaned child processes"
    state = checkpoint.load(checkpoint.latest(preempted.as_stopped))
    last_row = read_metrics(preempted.as_stopped)[-1]["env_steps"]
    assert state["steps"]["env_steps"] >= last_row > 0  # the stop checkpointed its last steps


@pytest.mark.slow
def test_a_stopped_run_ends_with_the_command_that_resumes_it(preempted, tmp_path):
    """The last line is the run's own command line with ``run.logdir`` its folder; that
    command, pasted to a near end in a shell whose PATH has no venv and another working
    directory, resumes the same folder where the run stopped."""
    logdir = preempted.logdir
    last = preempted.text.strip().splitlines()[-1]
    prefix = "resume it with: "
    assert prefix in last, preempted.text[-3000:]
    command = shlex.split(last.split(prefix, 1)[1])
    assert command[:3] == [sys.executable, "-m", "dreamer.train"]
    assert f"run.logdir={logdir.resolve()}" in command
    assert [arg for arg in command[3:] if not arg.startswith("run.logdir=")] == [
        *QUICK,
        UNTIL_STOPPED,
        "run.progress=false",
    ]
    stopped_at = preempted.stopped_at()
    dropped = ("run.steps=", "run.progress=")
    pasted = [a for a in command if not a.startswith(dropped)]
    pasted += [f"run.steps={stopped_at + 200}", "run.progress=false"]
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    if "XDG_CACHE_HOME" in os.environ:
        bare["XDG_CACHE_HOME"] = os.environ["XDG_CACHE_HOME"]
    resumed = subprocess.run(
        ["bash", "-c", shlex.join(pasted)],
        env=bare,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from checkpoint-{stopped_at:012d}.pt at env step {stopped_at}" in (
        resumed.stdout + resumed.stderr
    )
    steps = [row["env_steps"] for row in read_metrics(logdir)]
    assert steps == sorted(set(steps)) and steps[-1] == stopped_at + 200, steps


def assert_quiet(text: str) -> None:
    noise = [line for line in text.splitlines() if "Traceback" in line or " ERROR " in line]
    noise += [line for line in text.splitlines() if " WARNING " in line]
    assert noise == [], text[-4000:]
    assert "\x1b[" not in text  # no terminal colour codes in a log file


MOMENTS = [  # where a stop is hardest: a child starting while the driver blocks SIGINT, ...
    ("collector_start", signal.SIGINT),  # torchrl starting the env workers and server
    ("render_start", signal.SIGINT),  # the render pool's workers
    ("eval_start", signal.SIGINT),  # torchrl's thread starting the evaluation process
    ("checkpoint_write", signal.SIGINT),  # a periodic checkpoint half written
]


@pytest.mark.slow
@pytest.mark.parametrize("moment, stop", MOMENTS, ids=[f"{m}-{s.name}" for m, s in MOMENTS])
def test_a_stop_at_each_hard_moment_checkpoints_and_ends_with_the_resume_line(
    tmp_path, moment, stop
):
    """The run stops itself at the moment (``DREAMER_STOP_AT``: the signal to its whole
    process group, as a terminal's Ctrl-C): it exits as that signal says, prints nothing
    from any of its processes, leaves a checkpoint that loads (no half-written file) and
    ends with the command that resumes it. Ctrl-C while torchrl started the collector's
    processes ended in an AssertionError from its shutdown: exit 1, no checkpoint."""
    logdir = tmp_path / "run"
    trainer = Trainer(
        logdir,
        *QUICK,
        UNTIL_STOPPED,
        "eval.every=200",
        "eval.episodes=1",
        "eval.max_steps=50",
        "run.save_every=1",  # a periodic checkpoint before the first row
        log=tmp_path / "run.log",
        session=True,  # its own process group, as a terminal's foreground job
        interruptible=True,
        env={signals.STOP_AT: f"{moment}:{stop.name}"},
    )
    expected = signals.INTERRUPT_EXIT if stop == signal.SIGINT else signals.REQUEUE_EXIT
    assert trainer.wait(300) == expected, trainer.tail()
    text = trainer.text()
    assert f"{stop.name} at {moment}" in text  # the moment came, and the stop with it
    assert_quiet(text)
    last = text.strip().splitlines()[-1]
    if stop == signal.SIGINT:
        assert f"interrupted: checkpoint written; resume it with: {sys.executable} -m" in last
    assert last.endswith(f"run.logdir={logdir.resolve()}"), last
    assert checkpoint.remove_partial(logdir) == []
    checkpoint.load(checkpoint.latest(logdir))


def on_a_terminal(command: str, until: bytes, timeout: float = 300) -> tuple[int, str]:
    """``command`` in a shell on a pseudo-terminal of its own (the session's foreground
    job, as a user's): Ctrl-C typed on it as soon as ``until`` shows. The shell starts
    with SIGINT ignored, as one that a script started in the background does (a suite
    run with ``&`` did: the run took the terminal and ignored every Ctrl-C): a run that
    takes the terminal takes its Ctrl-C, whatever it inherited. Returns the exit code
    and the screen."""
    user = as_a_user()  # not `make test`'s (a sub-make prints "Leaving directory" last)
    pid, terminal = pty.fork()
    if pid == 0:  # the child: the terminal's session leader
        os.chdir(ROOT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.execvpe("sh", ["sh", "-c", command], user)
    screen, typed, deadline = b"", False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not typed and until in screen:
            os.write(terminal, b"\x03")  # the terminal sends SIGINT to its foreground group
            typed = True
        if select.select([terminal], [], [], 0.5)[0]:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # the session ended
                break
            if not chunk:
                break
            screen += chunk
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(terminal)
    return os.waitstatus_to_exitcode(status), screen.decode(errors="replace")


@pytest.mark.slow
def test_ctrl_c_of_make_smoke_ends_with_the_resume_line(tmp_path):
    """Ctrl-C typed at `make smoke` on a terminal: the last line on screen is the command
    that resumes the run (make printed "make: *** [...] Error 130" or "Interrupt" below
    it), make exits 0, and the terminal is the shell's again."""
    logdir = tmp_path / "run"
    make = shlex.join(
        [
            "make",
            "-o",
            ".venv/.installed",  # whatever its age: the tests' interpreter is installed
            "smoke",
            f"PY={sys.executable}",
            f"ARGS={UNTIL_STOPPED} run.progress=false run.logdir={logdir}",
        ]
    )
    ours = "import os; print('foreground:', os.tcgetpgrp(0) == os.getpgrp())"
    code, screen = on_a_terminal(
        f"{make}; echo make: $?; {shlex.quote(sys.executable)} -c {shlex.quote(ours)}",
        b"env worker pids",
    )
    lines = [line for line in screen.replace("\r", "\n").splitlines() if line.strip()]
    assert code == 0 and lines[-2:] == ["make: 0", "foreground: True"], screen[-3000:]
    assert "resume it with: " in lines[-3], screen[-3000:]
    assert lines[-3].endswith(f"run.logdir={logdir.resolve()}")
    assert "make: ***" not in screen
    assert_quiet(screen.replace("^C", ""))
    assert checkpoint.latest(logdir) is not None


@pytest.fixture
def sigint(request):
    """SIGINT handled as ``request.param`` for the test: Python's KeyboardInterrupt as in
    a terminal, or ignored as in a background job (whatever started this suite)."""
    previous = signal.signal(signal.SIGINT, request.param)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("sigint", [signal.default_int_handler], indirect=True)
def test_ctrl_c_during_an_update_waits_for_its_end_and_a_second_one_does_not(sigint):
    """The loop's update runs whole: the checkpoint a Ctrl-C writes holds no half
    update. A second Ctrl-C raises at once; the handler is the default one after."""
    done = []
    with pytest.raises(KeyboardInterrupt), signals.ctrl_c_after_block():
        signal.raise_signal(signal.SIGINT)
        done.append("the rest of the update")
    assert done == ["the rest of the update"]
    with pytest.raises(KeyboardInterrupt), signals.ctrl_c_after_block():
        signal.raise_signal(signal.SIGINT)
        done.append("after the first")
        signal.raise_signal(signal.SIGINT)
        done.append("after the second")
    assert done[1:] == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("sigint", [signal.SIG_IGN], indirect=True)
def test_an_ignored_ctrl_c_stays_ignored_around_an_update(sigint):
    """A run started in the background with SIGINT ignored is not made interruptible."""
    with signals.ctrl_c_after_block():
        signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


@pytest.mark.slow
def test_resume_latest_continues_the_newest_unfinished_run_without_its_path(preempted, tmp_path):
    """``run.resume=latest`` (``make resume``) in the folder a default run wrote to: the
    newest run of the env whose checkpoint is short of ``run.steps`` resumes, a newer
    finished one is passed over, and no new run directory is made."""
    runs = tmp_path / "runs" / "cue"
    stopped = runs / "20260101-000000"
    shutil.copytree(preempted.as_stopped, stopped)  # a preempted run of cue
    at = preempted.stopped_at()
    finished = runs / "20260102-000000" / "checkpoints"
    finished.mkdir(parents=True)
    (finished / "checkpoint-999999999999.pt").write_bytes(b"")  # its name says: done
    done = run_module(
        "dreamer.train",
        *QUICK,
        f"run.steps={at + 200}",
        "run.resume=latest",
        "run.progress=false",
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from checkpoint-{at:012d}.pt" in done.stderr
    assert read_metrics(stopped)[-1]["env_steps"] == at + 200
    assert sorted(p.name for p in runs.iterdir()) == ["20260101-000000", "20260102-000000"]
    nothing = run_module(
        "dreamer.train", "env=cue", "run.resume=latest", cwd=tmp_path / "runs"
    )  # no runs/cue below it
    assert nothing.returncode == 2
    assert nothing.stderr.startswith("error: nothing to resume under runs/cue/: no run of cue")
    assert nothing.stderr.count("\n") == 1


def make_resume(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``make resume`` as a user types it in ``cwd`` (a clone's folder: its runs/)."""
    make = ["make", "-s", "-f", str(ROOT / "Makefile"), "-o", ".venv/.installed", "resume"]
    return subprocess.run(
        [*make, f"PY={sys.executable}", *args],
        cwd=cwd, env=as_a_user(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_make_resume_continues_a_stopped_run_with_its_own_config_then_says_it_is_done(tmp_path):
    """``make resume`` with no ARGS where runs/crafter/ holds a smoke run stopped part way
    (its model, chunk and run.steps not the defaults): it continues that run with that
    run's own config to its own run.steps. Typed again: nothing to resume, in one line
    naming the folder, the run it found and its steps, and the commands that go on."""
    logdir = tmp_path / "runs" / "crafter" / "20260101-000000"
    smoke = ["experiment=smoke", "run.steps=600", "run.train_starts=200", "eval.every=0"]
    smoke.append("run.train_ratio=4")  # 25 updates: the resume is under test, not learning
    stop = {signals.STOP_AT: "checkpoint_write:SIGTERM:1"}  # its first checkpoint, 1 s in
    first = Trainer(
        logdir, *smoke, "run.save_every=1", log=tmp_path / "run.log", env=stop, session=True
    )
    assert first.wait(300) == signals.REQUEUE_EXIT, first.tail()
    stopped_at = checkpoint.saved_steps(logdir)[-1]
    assert 0 < stopped_at < 600
    resumed = make_resume(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from checkpoint-{stopped_at:012d}.pt" in resumed.stderr
    assert "training tiny on crafter" in resumed.stderr  # smoke's model, not size12m
    assert "chunk=16" in resumed.stderr  # smoke's collector.chunk, not 64
    assert read_metrics(logdir)[-1]["env_steps"] == 600
    assert [p.name for p in logdir.parent.iterdir()] == [logdir.name]  # no new run
    again = make_resume(tmp_path)
    errors = [line for line in again.stderr.splitlines() if not line.startswith("make")]
    assert again.returncode == 2 and errors == [
        f"error: nothing to resume under runs/crafter/: its run is finished (the newest, "
        f"{logdir.name}, has 600 env steps of run.steps=600); train it longer with "
        f"run.steps=<more> run.logdir=runs/crafter/{logdir.name}, start a new run with make "
        "train, or resume another env's with make resume ARGS=env=<name>"
    ], again.stderr


@pytest.mark.slow
def test_a_gym_run_writes_under_its_id_and_make_resume_finds_it(tmp_path):
    """A gymnasium run names its env in its folder, runs/gym/<id>/<ts>/ (it was
    runs/gym/<ts>/ and its lines said "gym"), and run.resume=latest continues it there."""
    pendulum = ("experiment=smoke", "env=gym", "env.id=Pendulum-v1", "eval.every=0")
    pendulum += ("run.train_starts=200", "run.progress=false")
    first = run_module("dreamer.train", *pendulum, "run.steps=300", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    (logdir,) = (tmp_path / "runs" / "gym" / "Pendulum-v1").iterdir()
    assert "training tiny on Pendulum-v1" in first.stderr
    assert f"logging to runs/gym/Pendulum-v1/{logdir.name}" in first.stderr
    again = run_module(
        "dreamer.train", *pendulum, "run.steps=400", "run.resume=latest", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stderr
    assert read_metrics(logdir)[-1]["env_steps"] == 400
    assert [p.name for p in (tmp_path / "runs" / "gym" / "Pendulum-v1").iterdir()] == [logdir.name]


@pytest.mark.slow
def test_a_metrics_row_comes_at_least_every_log_seconds(tmp_path):
    """``run.log_every`` far beyond the run: rows still come every ``run.log_seconds``
    of wall time (a CPU run's first row was ~78 minutes away), at new env steps only."""
    logdir = tmp_path / "run"
    trainer = Trainer(
        logdir,
        *QUICK,
        "run.log_every=100000000",
        "run.log_seconds=1",
        UNTIL_STOPPED,
        log=tmp_path / "run.log",
    )
    rows = trainer.wait_rows(4)  # log_every alone would write none before the stop
    assert trainer.stop() == signals.REQUEUE_EXIT, trainer.tail()
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(set(steps))
    # a row waits for its log_seconds (the run's own clock); how much longer depends
    # on the burst or wait it fell into, which no bound on a loaded machine can judge
    assert all(row["time/wall_s"] >= 0.99 for row in rows[1:]), rows


def test_a_reset_handshake_of_the_resource_sharer_prints_nothing(monkeypatch, capsys):
    """What a Ctrl-C once printed from the driver: multiprocessing's resource sharer
    thread losing a child mid-handshake. Other exceptions still reach the old hook."""
    from dreamer.runtime import signals as run_signals

    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    run_signals.quiet_handshake_resets()
    run_signals.quiet_handshake_resets()  # a second main() in one process: one hook
    assert sys.excepthook.quiet_handshakes
    for code, path in (
        ("raise ConnectionResetError(104, 'Connection reset by peer')", "resource_sharer.py"),
        ("raise ConnectionResetError(104, 'elsewhere')", "mine.py"),
        ("raise ValueError('not a handshake')", "resource_sharer.py"),
    ):
        try:
            exec(compile(code, f"/usr/lib/python3/multiprocessing/{path}", "exec"))
        except Exception:
            sys.excepthook(*sys.exc_info())
    printed = capsys.readouterr().err
    assert "Connection reset by peer" not in printed
    assert "elsewhere" in printed and "not a handshake" in printed


EXITS = """
import atexit, sys, threading, time
from dreamer.runtime.signals import exit_now
atexit.register(print, "atexit handler ran")
late = threading.Thread(target=lambda: (time.sleep(0.3), print("thread ended", end="; ")))
late.start()
print("buffered", end="; ")  # stdout is a pipe: block-buffered until the end
exit_now(3)
print("never")
"""


def test_a_command_ends_with_its_code_its_threads_atexit_handlers_and_whole_output():
    """The commands end by ``signals.exit_now`` (no interpreter finalization): what
    ``sys.exit`` does before that still happens, in its order."""
    done = subprocess.run([sys.executable, "-c", EXITS], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (
        3,
        "buffered; thread ended; atexit handler ran\n",
        "",
    )
