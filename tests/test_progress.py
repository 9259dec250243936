"""The progress bar of a resumed run counts its own updates from the start (it showed
upd_s=0.00 while updates ran), and shows every update it is told of; its env-step rate
falls while a burst of updates holds the env steps (tqdm's stood at its last value)."""

import io
import re
import time

import pytest

from dreamer.outputs import logs
from dreamer.runtime.schedules import TrainRatio
from tests.runs import run_trainer


def test_a_resumed_runs_bar_rates_its_own_updates(monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(logs.sys, "stderr", screen)
    bar = logs.Progress(10_000, 5_000, enabled=True, updates=300)
    bar.bar.mininterval = 0  # draw on every call
    for update in range(301, 311):
        time.sleep(0.01)
        bar.update(5_000, update)  # an update burst: no new env steps, the bar still moves
    bar.close()
    shown = [
        (int(u), float(r)) for u, r in re.findall(r"upd=(\d+), upd_s=([\d.]+)", screen.getvalue())
    ]
    assert [u for u, _ in shown][-1] == 310
    assert len({u for u, _ in shown}) >= 5  # redrawn while no env step came
    assert all(rate > 0 for _, rate in shown[1:])
    assert shown[-1][1] < 10 / 0.1  # 10 updates in >= 0.1 s: its own, not 310


@pytest.mark.parametrize("chunk", [1, 32, 48])
def test_the_schedule_says_how_many_updates_it_has_left(chunk):
    """The bar's ETA counts the updates the schedule will give: from its first update
    (the first batch past train_starts), whatever the collection's chunk, and after a
    resume from its saved state."""
    schedule = TrainRatio(train_ratio=512, batch=4, length=16, starts=200)
    end = 1_000
    before = schedule.left(end)
    steps = range(chunk, end + 1, chunk)
    given, predicted = 0, None
    for step in steps:
        due = schedule(step, ready=True)
        if due and predicted is None:  # the first update: the count is known from here
            predicted = due + schedule.left(steps[-1])
        given += due
        if step == steps[len(steps) // 2]:
            resumed = TrainRatio(train_ratio=512, batch=4, length=16, starts=200)
            resumed.load_state_dict(schedule.state_dict())
            assert resumed.left(steps[-1]) == schedule.left(steps[-1])
    assert predicted - 1 < given <= predicted, (predicted, given)  # the schedule floors
    assert schedule.left(steps[-1]) < 1
    assert before == (end - 200) * 8 + 1  # before any: from train_starts


class Clock:
    """A clock the test moves: the bar's rates and ETA read it, never the machine's."""

    def __init__(self):
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def drawn(screen: io.StringIO) -> list[tuple[int, float, str, int]]:
    """The bar's redraws: (env steps, step_s, eta, upd)."""
    return [
        (int(n.replace(",", "")), float(rate), eta, int(updates))
        for n, rate, eta, updates in re.findall(
            r"\| ([\d,]+)/[\d,]+ \[[\d:]+, step_s=([\d.]+), eta=([\d:?]+), upd=(\d+)",
            screen.getvalue().replace("\r", "\n"),
        )
    ]


def seconds(clock: str) -> int:
    """tqdm's [H:]MM:SS as seconds."""
    total = 0
    for part in clock.split(":"):
        total = 60 * total + int(part)
    return total


def test_the_eta_is_unknown_until_the_loop_has_timed_its_updates_then_their_mean(monkeypatch):
    """The ETA is the updates the schedule has left times the loop's seconds per update,
    from its first update on ("?" before its second: no rate yet). During a burst of
    updates (no new env steps) the env-step rate falls: it is this process's mean
    (tqdm's stood at its last value). Without updates to come, the env-step rate gives
    it. The test's clock drives the bar: the figures are exact, whatever the machine
    does meanwhile."""
    screen, clock = io.StringIO(), Clock()
    monkeypatch.setattr(logs.sys, "stderr", screen)
    bar = logs.Progress(10_000, 0, enabled=True, clock=clock)
    bar.bar.mininterval = 0  # draw on every call
    bar.expect(100)  # the schedule: 100 updates by run.steps
    clock.now += 5
    bar.update(500, 0)
    clock.now += 1
    bar.update(500, 1)  # the first update: one is no rate yet
    for update in range(2, 12):  # a burst: 0.5 s each, env steps held at 500
        clock.now += 0.5
        bar.update(500, update)
    frames = drawn(screen)
    assert [(eta, upd) for _, _, eta, upd in frames[:2]] == [("?", 0), ("?", 1)]
    assert (seconds(frames[2][2]), frames[2][3]) == ((100 - 2) * 0.5, 2)  # 0.5 s per update
    assert (seconds(frames[-1][2]), frames[-1][3]) == (int((100 - 11) * 0.5), 11)
    elapsed = [5, 6] + [6 + 0.5 * k for k in range(1, 11)]
    assert [rate for _, rate, _, _ in frames] == [round(500 / t, 2) for t in elapsed]
    bar.expect(11)  # none left: the env-step rate, (10,000 - 8,000) / (8,000 / 16 s)
    clock.now = 1_016.0
    bar.update(8_000, 11)
    assert seconds(drawn(screen)[-1][2]) == 4
    bar.close()


@pytest.mark.slow
def test_a_runs_bar_shows_the_loops_eta_and_counts_every_update_to_its_end(tmp_path):
    """A learner-bound run (cartpole, 4 updates per env step): the speed note comes with
    the run's first updates, the bar shows an ETA from the loop's second update on, and
    its last redraw shows every update the run made, with nothing left (the bar counted
    updates from ``train_starts``, 240, where the schedule made 145). What the ETA is at
    each redraw is the unit test's above, on a clock it controls: here two wall times
    taken at different moments would judge it, on a loaded machine."""
    overrides = ("experiment=smoke", "env=cartpole", "run.train_starts=200", "run.steps=260")
    overrides += ("run.train_ratio=256", "eval.every=0")
    result = run_trainer(tmp_path / "run", *overrides, timeout=300, progress=True)
    assert result.returncode == 0, result.stderr[-3000:]
    screen = result.stderr.replace("\r", "\n")
    note = re.search(r"takes ([\d.]+) s on this CPU .* needs ~([\d,]+) more updates", screen)
    assert note, screen[-3000:]
    assert screen.index("under way: first transitions") < screen.index(note[0])
    frames = [
        (eta, int(updates)) for eta, updates in re.findall(r"eta=([\d:?]+), upd=(\d+)", screen)
    ]
    made = int(re.search(r"done: \d+ env steps, (\d+) updates", screen)[1])
    assert made >= 100 and frames[-1] == ("00:00", made)
    assert all((eta == "?") == (updates < 2) for eta, updates in frames), frames
