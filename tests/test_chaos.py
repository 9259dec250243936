"""benchmarks/chaos.py, five faults in one run: a real run whose driver, env worker and
inference server are SIGKILLed, whose run directory fills up and whose latest checkpoint
is damaged survives them all, and nothing is duplicated, missing or left over. Each kind
alone, and the evaluation process's and a render worker's deaths, have tests of their
own (tests/test_kill.py, test_failures.py, test_deaths.py, test_full_disk.py,
test_resume.py); the 20-kill runs of every kind are in benchmarks/README.md. The run
lasts until its last fault's recovery whatever the machine's speed (chaos.py stops it
then and lets a rerun finish it)."""

import json
import sys
from pathlib import Path

import pytest

from tests import zygote
from tests.runs import can_mount_tmpfs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import chaos  # noqa: E402
from chaos import check_rows, judged_end, stopped_for_a_full_disk  # noqa: E402


def forked(command: list[str], log: Path):
    """An attempt of chaos.py's run forked from the zygote (``python -m dreamer.train``),
    as the suite's other runs: ~4 s of CPU less per rerun than a fresh interpreter."""
    log.write_text("")
    return zygote.start(command[2], command[3:], log)


@pytest.mark.slow
def test_kills_and_storage_faults_in_one_run_lose_nothing(tmp_path):
    """The three process kinds that a run always has and, as root (the run directory is
    then a tmpfs mount), a full run directory and a corrupt latest checkpoint: each once.
    chaos.py's harness runs in this process, its run's attempts forked from the zygote."""
    storage = can_mount_tmpfs()
    kinds = ["driver", "env_worker", "inference"] + ["disk_full", "corrupt_checkpoint"] * storage
    result_path = tmp_path / "chaos.json"
    argv = ["--kills", str(len(kinds)), "--seed", "3", "--kinds", *kinds]
    argv += ["--storage"] if storage else []
    # recoveries on two cores shared with the other test worker: up to 10 minutes each
    argv += ["--timeout", "600", "--json", str(result_path)]
    code = chaos.main(argv, start=forked)
    result = json.loads(result_path.read_text())
    assert code == 0, json.dumps(result, indent=1)
    assert result["harness_failure"] is None and result["delivered"] is True
    faults = {**result["kills"], **result["faults"]}
    # the least-hit kind goes next: each drawn kind once
    assert {kind: n for kind, n in faults.items() if n} == dict.fromkeys(kinds, 1), faults
    assert result["survived"] is True
    assert (result["duplicated_rows"], result["missing_rows"], result["orphans"]) == (0, 0, 0)


def test_an_evaluation_the_run_skipped_with_a_line_is_not_missing():
    train = [{"env_steps": step} for step in range(100, 1601, 100)]
    evals = [{"env_steps": step, "eval/return": 1.0} for step in (512, 1504)]
    assert check_rows(train + evals, 1600, 100, 500) == (0, 1)  # due at 1,000: no row
    assert check_rows(train + evals, 1600, 100, 500, skipped=[1024]) == (0, 0)
    assert check_rows(train + evals + evals[:1], 1600, 100, 500, [1024]) == (1, 0)


def test_a_full_disk_may_stop_the_run_at_its_checkpoints_or_at_its_outputs():
    """A fast run saves several times (``run.save_every=1``) before its next metrics row:
    the checkpoint writes fail first and stop it, with their own line."""
    saves = "error: 3 checkpoint writes in a row failed (last: ...); a rerun resumes from x"
    output = "error: /tmp/run/tensorboard: No space left on device"
    assert stopped_for_a_full_disk(1, f"log\n{saves}\n")
    assert stopped_for_a_full_disk(1, f"log\n{output}\n")
    assert not stopped_for_a_full_disk(0, f"log\n{saves}\n")  # it must stop
    assert not stopped_for_a_full_disk(1, "error: replay: a worker died\n")
    assert not stopped_for_a_full_disk(1, f"{output}\n{saves}\n")  # one line, not two


def test_rows_of_a_run_a_failure_stopped_early_are_not_duplicates():
    """With no step limit the run goes on past ``--steps`` until a failure stops the
    harness: its rows there are one per interval, not many final rows."""
    rows = [{"env_steps": step} for step in range(100, 4801, 100)]
    end = judged_end(2750, finished=False, rows=rows)
    assert end == 4800
    assert check_rows(rows, end, 100, 0) == (0, 0)
    assert check_rows(rows, judged_end(2750, True, rows), 100, 0) == (20, 0)  # as before
    assert check_rows(rows[:10] + rows[9:], end, 100, 0) == (1, 0)  # a real duplicate
