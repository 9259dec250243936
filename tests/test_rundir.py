"""An unusable ``run.logdir`` is one line and exit 2 before anything is built, and
leaves nothing behind: a file, a folder under a file, a read-only filesystem, /proc."""

import os
import subprocess
from pathlib import Path

import pytest

from tests.runs import can_mount_tmpfs, forked_runs, tmpfs


def refused(tmp_path: Path, logdirs: list[Path]) -> list[subprocess.CompletedProcess]:
    rows = [(["experiment=smoke", "env=cue", f"run.logdir={d}"], []) for d in logdirs]
    out = tmp_path / "out"
    out.mkdir()
    return forked_runs("dreamer.train", rows, out, timeout=300)


def assert_one_line(run: subprocess.CompletedProcess, *words: str) -> None:
    assert run.returncode == 2, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: run.logdir: "), run.stderr
    assert all(word in lines[0] for word in words), lines[0]


def test_a_file_a_folder_under_a_file_and_proc_are_refused_in_one_line(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    under_proc = Path(f"/proc/{os.getpid()}/run")
    runs = refused(tmp_path, [a_file, a_file / "run", a_file / "deeper" / "run", under_proc])
    assert_one_line(runs[0], str(a_file), "is a file")
    assert_one_line(runs[1], str(a_file), "is a file")
    assert_one_line(runs[2], str(a_file), "is a file")
    assert_one_line(runs[3], str(under_proc))
    assert a_file.read_text() == "mine\n"  # the user's file is untouched


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root to mount a read-only tmpfs")
def test_a_read_only_folder_is_refused_and_nothing_is_left(tmp_path):
    mount = tmp_path / "readonly"
    with tmpfs(mount, "1m"):
        (mount / "existing").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        runs = refused(tmp_path, [mount / "existing", mount / "new" / "run"])
        assert_one_line(runs[0], str(mount / "existing"), "read-only")
        assert_one_line(runs[1], str(mount / "new" / "run"), "read-only")
        assert sorted(p.name for p in mount.iterdir()) == ["existing"]
        assert list((mount / "existing").iterdir()) == []
