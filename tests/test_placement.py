"""benchmarks/threads.py's loop-over-alone ratio taken in the placement of the host's
cores that the loop had (benchmarks/placement.py)."""

import os

import pytest

from benchmarks.placement import FAR_NS, Probe, by_placement, where
from benchmarks.threads import placed_ratio, rows_by_placement


def one_round(rows: dict, near: float, far: float, one_thread: float):
    """A threads.py round: the loop's rows per placement, the update alone's spans."""
    alone_two = by_placement([near, far, near], ["near", "far", "mixed"])
    return {
        "layouts": {"default": {"rows_by_placement": rows}},
        "alone_s_per_update": {1: one_thread, 2: min(near, far)},
        "alone_placement": {2: alone_two},
    }


def placed(near_updates: int, near_s: float, far_updates: int, far_s: float) -> dict:
    return {
        "near": {"updates": near_updates, "loop_s_per_update": near_s},
        "far": {"updates": far_updates, "loop_s_per_update": far_s},
    }


def test_the_loop_in_each_placement_is_compared_with_the_update_alone_there():
    # the best alone (0.38 near) is not what the loop's far rows are compared with
    rows = placed(40, 0.5, 60, 0.55)
    assert placed_ratio(one_round(rows, 0.4, 0.5, 0.66), "default") == (
        "near 1.25 (40 updates); far 1.10 (60 updates)"
    )
    # one thread alone knows no placement: it counts where it is the faster
    rows = placed(0, 0.0, 60, 0.5)
    assert placed_ratio(one_round(rows, 0.38, 0.7, 0.625), "default") == "far 0.80 (60 updates)"


def test_a_placement_with_no_update_alone_gives_no_ratio():
    rounds = one_round(placed(30, 0.5, 0, 0.0), 0.4, 0.5, 0.66)
    rounds["alone_placement"][2] = by_placement([0.5], ["far"])
    assert placed_ratio(rounds, "default") == "near none alone (30 updates)"


def test_a_row_counts_in_a_placement_only_if_every_probe_in_its_interval_saw_it():
    near, far = FAR_NS - 50, FAR_NS + 50
    rows = [{"env_steps": 0, "updates": 0}]  # before updates began: never timed
    intervals = [(2, 1.0, 0.8), (4, 2.0, 1.6), (3, 1.5, 1.2), (2, 1.2, 1.0)]
    for index, (updates, wall, own) in enumerate(intervals):
        rows.append(
            {
                "env_steps": 100 * (index + 1),
                "updates": rows[-1]["updates"] + updates,
                "timestamp": 10.0 * (index + 1),
                "time/wall_s": wall,
                "time/update_s": own,
            }
        )
    samples = [(9.5, near), (18.5, near), (19.5, near), (28.6, near), (29.5, far), (39.5, far)]
    split = rows_by_placement(rows, 0, samples)
    # the first row with updates (compiling) is never timed; the third moved: neither
    assert split["near"] == {"updates": 4, "loop_s_per_update": 0.5, "s_per_update": 0.4}
    assert split["far"] == {"updates": 2, "loop_s_per_update": 0.6, "s_per_update": 0.5}


def test_a_span_is_near_or_far_only_if_the_probes_on_both_sides_agree():
    near, far = FAR_NS - 50, FAR_NS + 50
    assert [where(near, near), where(far, far), where(near, far), where(far, near)] == [
        "near",
        "far",
        "mixed",
        "mixed",
    ]
    split = by_placement([1.0, 3.0, 2.0, 9.0], ["near", "near", "near", "mixed"])
    assert split["near"] == {"n": 3, "s": 2.0} and split["far"] == {"n": 0, "s": None}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_probe_runs_in_a_helper_and_forks_nothing_here(monkeypatch):
    """A fork of the measured process would mark its pages copy-on-write."""

    def forbidden():
        raise AssertionError("the measured process forked")

    monkeypatch.setattr(os, "fork", forbidden)
    probe = Probe(rounds=100)
    try:
        assert all(ns > 0 for ns in (probe(), probe()))
    finally:
        probe.close()
    assert probe.helper.returncode == 0
