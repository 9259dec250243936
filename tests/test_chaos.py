"""benchmarks/chaos.py with five kills (the 20-kill runs are in benchmarks/README.md): a
real run whose processes are SIGKILLed at random survives each kill, and nothing is
duplicated, missing or left over. The run lasts until its last kill's recovery whatever
the machine's speed (chaos.py stops it then and lets a rerun finish it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the run directory is a tmpfs mount: root")
def test_storage_faults_between_kills_lose_nothing(tmp_path):
    """A full run directory and a corrupt latest checkpoint, with an env worker kill."""
    result_path = tmp_path / "chaos.json"
    command = [sys.executable, "benchmarks/chaos.py", "--kills", "3", "--storage"]
    command += ["--kinds", "disk_full", "corrupt_checkpoint", "env_worker", "--seed", "2"]
    command += ["--timeout", "600", "--json", str(result_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=2400)
    assert result_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert done.returncode == 0, json.dumps(result, indent=1)
    # the least-hit kind goes next: each of the three once
    assert result["faults"] == {"disk_full": 1, "corrupt_checkpoint": 1}, result
    assert result["kills"]["env_worker"] == 1 and result["survived"] is True
    assert (result["duplicated_rows"], result["missing_rows"], result["orphans"]) == (0, 0, 0)


@pytest.mark.slow
def test_five_random_kills_lose_nothing(tmp_path):
    result_path = tmp_path / "chaos.json"
    command = [sys.executable, "benchmarks/chaos.py", "--kills", "5", "--seed", "3"]
    # recoveries on two cores shared with the other test worker: up to 10 minutes each
    command += ["--timeout", "600", "--json", str(result_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=2400)
    assert result_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert done.returncode == 0, json.dumps(result, indent=1)
    assert result["harness_failure"] is None and result["delivered"] is True
    assert sum(result["kills"].values()) == 5
    # the least-killed kind goes next: five kills reach at least four kinds
    assert sum(1 for n in result["kills"].values() if n) >= 4, result["kills"]
    assert result["survived"] is True
    assert (result["duplicated_rows"], result["missing_rows"], result["orphans"]) == (0, 0, 0)


def test_an_evaluation_the_run_skipped_with_a_line_is_not_missing():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from chaos import check_rows

    train = [{"env_steps": step} for step in range(100, 1601, 100)]
    evals = [{"env_steps": step, "eval/return": 1.0} for step in (512, 1504)]
    assert check_rows(train + evals, 1600, 100, 500) == (0, 1)  # due at 1,000: no row
    assert check_rows(train + evals, 1600, 100, 500, skipped=[1024]) == (0, 0)
    assert check_rows(train + evals + evals[:1], 1600, 100, 500, [1024]) == (1, 0)
