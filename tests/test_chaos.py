"""benchmarks/chaos.py with a few kills: the run survives each, nothing duplicated,
missing or left over (the full 20-kill runs are in the benchmarks README)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skip(
    reason="issue 19 open: not yet green (a replacement collector can take past chaos.py's "
    "300 s recovery limit on a loaded 2-core machine); run it by hand"
)
def test_five_random_kills_lose_nothing(tmp_path):
    result_path = tmp_path / "chaos.json"
    command = [sys.executable, "benchmarks/chaos.py", "--kills", "5", "--seed", "3"]
    command += ["--steps", "1000", "--json", str(result_path), "run.train_ratio=2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert result_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert done.returncode == 0, json.dumps(result, indent=1)
    assert sum(result["kills"].values()) == 5
    assert result["survived"] is True
    assert (result["duplicated_rows"], result["missing_rows"], result["orphans"]) == (0, 0, 0)
