"""Collection paced by the learner (``collector.pace``) and the collector's processes
forked from one preloaded forkserver: real runs, read through /proc."""

from pathlib import Path

import pytest
import torch

from dreamer.data import collect
from dreamer.learning.learner import learner_threads
from tests.runs import QUICK, UNTIL_STOPPED, Trainer, read_metrics


def niceness(pid: int) -> int:
    """Field 19 of /proc/<pid>/stat (after the parenthesised command name)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


@pytest.mark.parametrize(
    ("configured", "cpu", "cores", "resolved"),
    [
        ("auto", True, 2, "nice"),  # the learner shares the cores with collection
        ("auto", True, collect.FEW_CORES, "nice"),
        ("auto", True, collect.FEW_CORES + 1, "none"),  # cores of their own
        ("auto", False, 2, "none"),  # a GPU learner: collection overlaps it
        ("pause", False, 64, "pause"),  # asked for: as asked
        ("none", True, 2, "none"),
    ],
)
def test_auto_paces_a_cpu_learner_on_few_cores(monkeypatch, configured, cpu, cores, resolved):
    monkeypatch.setattr(collect, "usable_cores", lambda: cores)
    assert collect.pace_mode(configured, cpu) == resolved


def test_a_paced_learner_gets_every_core_and_an_unpaced_one_half(monkeypatch):
    import dreamer.learning.learner as learner

    monkeypatch.setattr(learner, "usable_cores", lambda: 4)
    cpu = torch.device("cpu")
    assert learner_threads(0, cpu, paced=True) == 4
    assert learner_threads(0, cpu, paced=False) == 2
    assert learner_threads(3, cpu, paced=True) == 3  # a configured count stays


def collector_pids(trainer: Trainer) -> tuple[list[int], int]:
    workers = [int(pid) for pid in trainer.wait_for(r"env worker pids: ([\d ]+)").split()]
    return workers, int(trainer.wait_for(r"inference server pid: (\d+)"))


@pytest.mark.slow
@pytest.mark.parametrize("pace", ["nice", "none"])
def test_nice_pace_lowers_the_collectors_priority_and_the_run_trains(tmp_path, pace):
    trainer = Trainer(
        tmp_path / "run", *QUICK, UNTIL_STOPPED, f"collector.pace={pace}", log=tmp_path / "log"
    )
    workers, server = collector_pids(trainer)
    rows = trainer.wait_rows(2, past=300)
    assert rows[-1]["updates"] > 0
    assert f"collection pace while it updates: {pace}" in trainer.text()
    expected = collect.NICE if pace == "nice" else 0
    assert [niceness(pid) for pid in [*workers, server]] == [expected] * (len(workers) + 1)
    assert niceness(trainer.pid) == 0  # the learner keeps its priority
    # forked from one forkserver (a child of the driver) that preloaded what they run
    servers = {parent(pid) for pid in [*workers, server]}
    assert len(servers) == 1, servers
    (forkserver,) = servers
    assert parent(forkserver) == trainer.pid
    assert "forkserver" in command_line(forkserver)
    assert "dreamer.data.collect" in command_line(forkserver)
    assert trainer.stop() == 75


@pytest.mark.slow
def test_paused_collection_trains_at_the_ratio_and_resumes_collecting(tmp_path):
    """pace=pause parks the collector around every update burst: the run still trains
    at its train ratio and collects between bursts (rows keep coming, updates grow)."""
    trainer = Trainer(
        tmp_path / "run", *QUICK, UNTIL_STOPPED, "collector.pace=pause", log=tmp_path / "log"
    )
    rows = trainer.wait_rows(4, past=300)
    assert trainer.stop() == 75
    rows = read_metrics(tmp_path / "run")
    steps = [row["env_steps"] for row in rows]
    updates = [row["updates"] for row in rows]
    assert steps == sorted(set(steps)) and updates == sorted(updates) and updates[-1] > 0
    # train ratio 4 at batch 4 x 16 (smoke): one update per 16 env steps after 200
    due = (steps[-1] - 200) * 4 / (4 * 16)
    assert abs(updates[-1] - due) <= 4, (updates[-1], due)  # within a collector batch
