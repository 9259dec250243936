"""benchmarks/threads.py's loop-over-alone ratio taken in the placement of the host's
cores that the loop had (benchmarks/placement.py)."""

import os

import pytest

from benchmarks.placement import FAR_NS, Probe, by_placement, where
from benchmarks.threads import (
    measure,
    placed_ratio,
    span_place,
    timed_rows,
    updates_by_placement,
)


def one_round(rows: dict, near: float, far: float, one_thread: float):
    """A threads.py round: the loop's rows per placement, the update alone's spans."""
    alone_two = by_placement([near, far, near], ["near", "far", "mixed"])
    return {
        "layouts": {"default": {"updates_by_placement": rows}},
        "alone_s_per_update": {1: one_thread, 2: min(near, far)},
        "alone_placement": {2: alone_two},
    }


def placed(near_updates: int, near_s: float, far_updates: int, far_s: float) -> dict:
    return {
        "near": {"loop_spans": near_updates, "loop_s_per_update": near_s},
        "far": {"loop_spans": far_updates, "loop_s_per_update": far_s},
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


def test_an_update_counts_in_a_placement_only_if_every_probe_around_it_saw_it():
    near, far = FAR_NS - 50, FAR_NS + 50
    samples = [(0.0, near), (1.0, near), (2.0, near), (3.0, far), (4.0, far), (5.0, far)]
    assert span_place(0.2, 0.8, samples) == "near"
    assert span_place(0.5, 1.5, samples) == "near"  # a probe inside agrees
    assert span_place(2.2, 2.8, samples) == "mixed"  # it may have moved in between
    assert span_place(3.1, 4.9, samples) == "far"
    assert span_place(5.1, 5.5, samples) == "mixed"  # no probe after it
    updates = [(0.1, 0.5), (0.6, 0.9), (1.1, 1.4), (2.2, 2.6), (3.1, 3.5), (3.6, 4.0)]
    split = updates_by_placement(updates, (0.6, 4.0), samples)
    # the first update is outside the window; 2.2-2.6 and the span 1.1-2.2 are mixed
    assert split["near"] == pytest.approx(
        {"updates": 2, "s_per_update": 0.3, "loop_spans": 1, "loop_s_per_update": 0.5}
    )
    assert split["far"] == pytest.approx(
        {"updates": 2, "s_per_update": 0.4, "loop_spans": 1, "loop_s_per_update": 0.5}
    )


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


def test_the_timed_window_opens_at_the_row_before_its_first_timed_row():
    rows = [
        {"env_steps": 1024, "updates": 0},
        {"env_steps": 2048, "updates": 1, "time/wall_s": 9.0, "time/update_s": 3.0},
        {"env_steps": 3072, "updates": 65, "time/wall_s": 30.0, "time/update_s": 28.0},
        {"env_steps": 4096, "updates": 129, "time/wall_s": 34.0, "time/update_s": 30.0},
    ]
    assert timed_rows(rows, 1000) == rows[1:]  # past 2048 + 1000: compiling excluded
    assert timed_rows(rows, 5000) == []
    measured = measure(rows, 1000)
    assert measured["loop_s_per_update"] == (30.0 + 34.0) / 128
    assert measured["s_per_update"] == (28.0 + 30.0) / 128
    assert measure(rows, 5000) == {"error": "no timed rows"}
    assert measure(rows[:1], 0) == {"error": "no update"}
