"""``make peers`` (benchmarks/peers/venvs.py): a bad OFFICIAL_SRC is refused before anything
is created, in one stderr line that says what to pass. No venv is built here."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import as_a_user

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "peers" / "venvs.py"
REQUIRED = ("dreamerv3/agent.py", "dreamerv3/configs.yaml", "embodied/jax/agent.py")


def venvs(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OFFICIAL_SRC"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), "--python", sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def fake_source(path: Path, leave_out: str | None = None) -> Path:
    for name in REQUIRED:
        if name != leave_out:
            (path / name).parent.mkdir(parents=True, exist_ok=True)
            (path / name).write_text("")
    return path


def refused(result: subprocess.CompletedProcess, root: Path) -> str:
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "OFFICIAL_SRC" in lines[0] and "github.com/danijar/dreamerv3" in lines[0]
    assert not (root / ".venv-peers").exists()
    assert result.stdout == ""
    return lines[0]


def test_unset(tmp_path):
    line = refused(venvs(tmp_path), tmp_path)
    assert "not set" in line
    # make passes "$(OFFICIAL_SRC)": empty when unset
    assert "not set" in refused(venvs(tmp_path, "--official-src", ""), tmp_path)


def test_not_a_directory(tmp_path):
    missing = tmp_path / "nowhere"
    line = refused(venvs(tmp_path, "--official-src", str(missing)), tmp_path)
    assert f"OFFICIAL_SRC={missing} is not a directory" in line
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert "is not a directory" in refused(venvs(tmp_path, "--official-src", str(a_file)), tmp_path)


@pytest.mark.parametrize("leave_out", REQUIRED)
def test_not_the_official_source(tmp_path, leave_out):
    source = fake_source(tmp_path / "src", leave_out)
    line = refused(venvs(tmp_path, "--official-src", str(source)), tmp_path)
    assert "is not the official DreamerV3 source" in line
    assert f"(no {leave_out})" in line  # names the one missing file, only that one


def test_the_environment_variable_is_read(tmp_path):
    env = {**os.environ, "OFFICIAL_SRC": str(tmp_path / "nowhere")}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert "is not a directory" in refused(result, tmp_path)


def test_a_valid_source_passes_validation(tmp_path):
    """The refusals above are not a script that refuses everything: with the three files a
    dry run accepts the source, records nothing and creates nothing."""
    source = fake_source(tmp_path / "src")
    result = venvs(tmp_path, "--official-src", str(source), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"(OFFICIAL_SRC={source.resolve()})" in result.stdout
    assert str(tmp_path / ".venv-peers" / "official") in result.stdout
    assert not (tmp_path / ".venv-peers").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_peers_fails_on_a_bad_source(tmp_path):
    """The Makefile target passes OFFICIAL_SRC on; make exits non-zero with the script's line
    (make adds its own ``*** Error 2``). Nothing is created in the repository."""
    existed = (ROOT / ".venv-peers").exists()
    bad = tmp_path / "nowhere"
    result = subprocess.run(
        ["make", "--no-print-directory", "peers", f"OFFICIAL_SRC={bad}"],
        cwd=ROOT,
        env=as_a_user(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert f"make peers: OFFICIAL_SRC={bad} is not a directory" in result.stderr
    assert (ROOT / ".venv-peers").exists() == existed


def test_an_interpreter_that_is_not_python311_is_refused(tmp_path):
    source = fake_source(tmp_path / "src")
    for python, what in ((str(tmp_path / "nopython"), "not found"), ("sh", "not 3.11")):
        result = venvs(tmp_path, "--official-src", str(source), "--python", python)
        assert result.returncode == 2, result
        assert len(result.stderr.splitlines()) == 1 and what in result.stderr, result.stderr
        assert not (tmp_path / ".venv-peers").exists()


@pytest.mark.parametrize(
    "argv, named",
    [(["--obs", "pixels"], "--obs"), (["--impls", "dreamerv4"], "--impls")],
)
def test_the_update_benchmark_refuses_bad_input_in_one_line(argv, named):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers" / "update.py"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and named in done.stderr, done.stderr
