"""benchmarks/threads.py's loop-over-alone ratio taken in the placement of the host's
cores that the loop had (benchmarks/placement.py)."""

import os

import pytest

from benchmarks.placement import FAR_NS, Probe, by_placement, where
from benchmarks.threads import placed_ratio


def one_round(loop_s: float, far_share: float, near: float, far: float, one_thread: float):
    alone_two = by_placement([near, far, near], ["near", "far", "mixed"])
    loop = {"loop_s_per_update": loop_s, "placement": {"far_share": far_share}}
    return {
        "layouts": {"default": loop},
        "alone_s_per_update": {1: one_thread, 2: min(near, far)},
        "alone_placement": {2: alone_two},
    }


def test_a_loop_run_near_is_compared_with_the_update_alone_near():
    # the best alone (0.38 near) is not what a loop run far is compared with
    assert placed_ratio(one_round(0.5, 0.9, 0.38, 0.5, 0.66), "default") == "1.00 (far 90%)"
    assert placed_ratio(one_round(0.5, 0.1, 0.4, 0.5, 0.66), "default") == "1.25 (near 90%)"
    # one thread alone knows no placement: it counts where it is the faster
    assert placed_ratio(one_round(0.5, 0.9, 0.38, 0.7, 0.625), "default") == "0.80 (far 90%)"


def test_a_placement_with_no_update_alone_gives_no_ratio():
    rounds = one_round(0.5, 0.05, 0.4, 0.5, 0.66)
    rounds["alone_placement"][2] = by_placement([0.5], ["far"])
    assert placed_ratio(rounds, "default").startswith("- (near 95%")


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
