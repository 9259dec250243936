"""The progress bar of a resumed run counts its own updates from the start (it showed
upd_s=0.00 while updates ran), and shows every update it is told of."""

import io
import re
import time

from dreamer.outputs import logs


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
