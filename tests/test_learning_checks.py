"""benchmarks/learning.py's DMC and Atari checks: the official scores they compare with
and the bad input they refuse (the training runs themselves take hours: the README)."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import learning  # noqa: E402

DMC = learning.OFFICIAL["dmc_proprio"]


@pytest.mark.parametrize("task", sorted(DMC["curves"]))
def test_the_stored_official_curves_agree_with_the_papers_table(task):
    """Two sources for one number: the score file's per-seed curves (the last three
    points, 470-490K) must round to the paper's 500K table, which would catch a seed or
    a point copied wrong."""
    seeds = np.asarray(DMC["curves"][task])
    assert seeds.shape == (5, len(DMC["steps"]))
    assert round(seeds[:, -3:].mean()) == DMC["table_500k"]["scores"][task]


def test_a_dmc_check_compares_with_the_official_mean_at_its_own_budget():
    steps, seeds = DMC["steps"], DMC["curves"]["pendulum_swingup"]
    at_50k, at_100k = (np.mean([seed[steps.index(n)] for seed in seeds]) for n in (50_000, 100_000))
    early, late = (
        learning.dmc_check("pendulum_swingup", 50_000),
        learning.dmc_check("pendulum_swingup", 100_000),
    )
    assert early.official["mean"] == pytest.approx(at_50k)
    assert late.official["mean"] == pytest.approx(at_100k)
    assert late.threshold == pytest.approx(0.9 * at_100k)
    assert early.official["mean"] < late.official["mean"]  # the curve, not one number
    assert "env.task=pendulum_swingup" in late.overrides and late.steps == 100_000
    table_only = learning.dmc_check("walker_walk", 500_000)
    assert table_only.official["mean"] == DMC["table_500k"]["scores"]["walker_walk"]
    game = learning.atari_check("breakout", None)
    assert game.steps == 100_000 and "env.game=breakout" in game.overrides


@pytest.mark.parametrize(
    "arguments, names",
    [
        (["dmc", "--task", "walker_wlak"], "walker_walk"),
        (["dmc", "--task", "cartpole_balance", "--budget", "55000"], "10000-490000"),
        (["dmc", "--task", "walker_walk", "--budget", "100000"], "500000"),
        (["atari", "--game", "pongg"], "pong"),
        (["atari", "--game", "pong", "--budget", "50000"], "100000"),
        (["cue", "--task", "cartpole_balance"], "dmc and atari"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(arguments, names, monkeypatch, capsys):
    # main() is what `python benchmarks/learning.py` exits with; in-process, no torch start-up
    monkeypatch.setattr(sys, "argv", ["learning.py", *arguments])
    assert learning.main() == 2
    stderr = capsys.readouterr().err
    assert len(stderr.strip().splitlines()) == 1 and names in stderr
