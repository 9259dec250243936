"""The suite's process guard (tests/leaks.py), on a suite of its own run by pytest: a
test that leaves a process running is red and the process is gone after it, whether the
process stayed below the test, left its session or was orphaned; a module fixture that
leaves one makes the whole run red."""

import os
import subprocess
import sys
import textwrap

from tests.leaks import SESSION_MARK, TEST_MARK
from tests.runs import ROOT, alive

SUITE = """
import os, subprocess, sys, time
import pytest

def write_pid(name, pid):
    with open(os.path.join(os.environ["OUT"], name), "w") as out:
        out.write(str(pid))

def test_leaves_a_child_in_a_session_of_its_own():
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    write_pid("session", child.pid)

def test_leaves_an_orphan():
    # a shell that starts a sleeper in the background and exits: the sleeper is
    # reparented away from the test process
    subprocess.run(["sh", "-c", "sleep 600 & echo $! > \\"$OUT/orphan\\""], check=True)

def test_fails_and_leaves_a_child():
    write_pid("failing", subprocess.Popen(["sleep", "600"]).pid)
    assert False, "the test's own failure"

def test_ends_what_it_started():
    child = subprocess.Popen(["sleep", "600"])
    child.kill()
    child.wait()

@pytest.fixture(scope="module")
def server():
    server = subprocess.Popen(["sleep", "600"], start_new_session=True)
    write_pid("module", server.pid)
    yield server  # and never ended

def test_uses_a_module_server(server):
    assert server.poll() is None

def test_uses_it_again(server):
    assert server.poll() is None  # not ended by the guard after the first test
"""


def test_a_leaked_process_fails_its_test_and_is_killed(tmp_path):
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(SUITE))
    environment = {
        key: value for key, value in os.environ.items() if key not in (SESSION_MARK, TEST_MARK)
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-p", "no:cacheprovider"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_leaky.py")],
        cwd=ROOT,
        env={**environment, "OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
        | {"DREAMER_TEST_GRACE": "1"},  # s before the guard kills what a test left
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    pids = {name: int((tmp_path / name).read_text()) for name in ("session", "orphan", "failing")}
    pids["module"] = int((tmp_path / "module").read_text())
    assert [name for name, pid in pids.items() if alive(pid)] == []
    assert "ERROR at teardown of test_leaves_a_child_in_a_session_of_its_own" in output, output
    assert "ERROR at teardown of test_leaves_an_orphan" in output, output
    assert "ERROR at teardown of test_fails_and_leaves_a_child" not in output, output
    assert "the test's own failure" in output
    assert "ERROR at teardown of test_ends_what_it_started" not in output, output
    assert "ERROR at teardown of test_uses" not in output, output  # the module's stays up
    assert "the suite left 1 processes running" in output, output
    assert f"{pids['module']}: sleep 600" in output
    # the two leaky tests pass their call and fail their teardown (an error each)
    assert "1 failed, 5 passed, 2 errors" in output, output
