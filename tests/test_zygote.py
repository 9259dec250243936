"""The tests' runs fork from one interpreter (tests/zygote.py): a forked command answers
as a fresh ``python -m`` does, and the imports it shares read none of the run's own
settings from the environment."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import zygote
from tests.runs import ROOT

# every dreamer variable the imports read (other than the process guard's marks, read
# with every copy of the whole environment): none may be
IMPORTS_READ = """
import json, os, sys
read = set()
class Recording(type(os.environ)):
    def __getitem__(self, key):
        read.add(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        read.add(key)
        return super().__contains__(key)
os.environ.__class__ = Recording
import dreamer.train, dreamer.evaluate, dreamer.export, dreamer.training.loop
from dreamer.command_line import load
load([])  # the zygote's warm-up
marks = ("DREAMER_TEST", "DREAMER_TEST_SESSION")  # the suite's own, in every copy of it
print(json.dumps(sorted(key for key in read if key.startswith("DREAMER_") and key not in marks)))
"""


def test_the_shared_imports_read_no_dreamer_variable():
    """A run forked from the zygote gets its environment after the imports: a variable
    read at import (a test hook such as ``DREAMER_STOP_AT``) would be the zygote's."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS_READ], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


@pytest.mark.parametrize(
    ("module", "arguments"),
    # a named folder: a run's default folder is named by the second it starts in
    [
        ("dreamer.train", ["--help"]),
        ("dreamer.train", ["run.steps=-5"]),
        ("dreamer.train", ["env=nope"]),
        ("dreamer.train", ["--cfg", "job", "run.logdir=runs/named"]),
        ("dreamer.export", ["run.logdir=."]),
    ],
    ids=["help", "refused", "unknown-env", "cfg", "export-refused"],
)
def test_a_forked_command_answers_as_a_fresh_one(module, arguments, tmp_path):
    fresh = subprocess.run(
        [sys.executable, "-m", module, *arguments],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    forked = zygote.run(module, arguments, cwd=tmp_path, timeout=60)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )


def test_a_dmc_run_or_a_foreign_variable_starts_fresh():
    """What the imports read (MuJoCo's renderer, OpenMP's settings) must be the run's."""
    assert zygote.forkable("dreamer.train", ["experiment=smoke"], {"DREAMER_STOP_AT": "x"})
    assert not zygote.forkable("dreamer.train", ["env=dmc"], None)
    assert not zygote.forkable("dreamer.train", ["experiment=dmc_proprio_cpu"], None)
    assert not zygote.forkable("dreamer.train", [], {"OMP_NUM_THREADS": "7"})
    assert not zygote.forkable("benchmarks.chaos", [], None)  # not a command it imported
