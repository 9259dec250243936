"""The render pool draws byte-identical files to a serial render; failures are reported."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dreamer.evaluation.render import WORKERS_ENV, RenderPool, pool_size


def jobs(seed: int = 0):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 255, (8, 16, 16, 3), dtype=np.uint8)
    model = rng.integers(0, 255, (8, 16, 16, 3), dtype=np.uint8)
    steps = list(range(0, 5000, 500))
    yield "open_loop", "open_loop.png", dict(truth=truth, model=model, context=3)
    yield "open_loop", "open_loop2.png", dict(truth=model, model=truth, context=5)
    yield (
        "curve",
        "curve.png",
        dict(
            series={
                "train": (steps, rng.normal(size=10).tolist()),
                "eval": (steps[::3], [1, 2, 3, 4]),
            },
            title="returns",
        ),
    )
    yield "bars", "bars.png", dict(names=["a", "b", "c"], values=[10.0, 50.5, 99.0], title="%")
    yield "video", "episode", dict(frames=rng.integers(0, 255, (12, 32, 32, 3), dtype=np.uint8))


def render_all(directory, workers: int) -> dict[str, str]:
    pool = RenderPool(workers)
    for kind, name, arguments in jobs():
        pool.submit(kind, directory / name, **arguments)
    pool.close()
    assert pool.failures == []
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


def test_pool_output_is_byte_identical_to_serial(tmp_path):
    serial = render_all(tmp_path / "serial", 0)
    pooled = render_all(tmp_path / "pool", 2)
    assert len(serial) == 5 and "episode.mp4" in serial
    assert pooled == serial


def test_environment_variable_overrides_the_pool_size(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "0")
    assert pool_size(4) == 0
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert pool_size(0) == 3
    monkeypatch.delenv(WORKERS_ENV)
    assert pool_size(5) == 5
    monkeypatch.setenv(WORKERS_ENV, "many")
    with pytest.raises(ValueError, match=WORKERS_ENV):
        pool_size(1)


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
    reason="needs affinity masks and a machine of 2+ cores to allow fewer than it has",
)
def test_default_pool_size_counts_the_cores_allowed_not_the_machine_s():
    """A 2-CPU SLURM allocation on a 64-core node: the process's affinity allows fewer
    cores than the machine has, and eval.render_workers' default follows the allowed."""
    probe = (
        "import os; from dreamer.evaluation.render import pool_size; "
        "from dreamer.runtime.cores import usable_cores; "
        "print(pool_size(None), usable_cores(), os.cpu_count())"
    )
    one_core = min(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k != WORKERS_ENV}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        preexec_fn=lambda: os.sched_setaffinity(0, {one_core}),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    workers, usable, machine = map(int, done.stdout.split())
    assert machine > 1 and (workers, usable) == (1, 1)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_failing_render_is_reported_and_others_still_draw(tmp_path, workers):
    pool = RenderPool(workers)
    pool.submit("open_loop", tmp_path / "bad.png", truth=np.zeros((2, 4)), model=None, context=1)
    pool.submit("bars", tmp_path / "good.png", names=["x"], values=[1.0], title="t")
    pool.close()
    assert len(pool.failures) == 1 and "bad.png" in pool.failures[0]
    assert (tmp_path / "good.png").exists() and not (tmp_path / "bad.png").exists()


def test_rate_bars_span_0_to_100_even_when_nothing_is_achieved(monkeypatch, tmp_path):
    from dreamer.evaluation import render

    limits = []
    monkeypatch.setattr(
        render, "_save", lambda figure, path, **_: limits.append(figure.axes[0].get_xlim())
    )
    render.bars(tmp_path / "a.png", ["collect_wood", "place_table"], [0.0, 0.0], "rates")
    render.bars(tmp_path / "b.png", ["collect_wood", "place_table"], [12.5, 0.0], "rates")
    assert limits == [(0.0, 100.0), (0.0, 100.0)]


def test_bars_with_nothing_achieved_say_so_on_the_figure(tmp_path):
    """All-zero bars read as a broken figure: a note across them says none yet."""
    from PIL import Image

    from dreamer.evaluation.render import bars

    names = ["collect_wood", "eat_cow", "wake_up"]
    for values, noted in (([0.0, 0.0, 0.0], True), ([0.0, 50.0, 0.0], False)):
        bars(tmp_path / "bars.png", names, values, "score", xlabel="% of 4 episodes")
        texts = json.loads(Image.open(tmp_path / "bars.png").text["Comment"])
        assert ("none yet" in texts) == noted
        assert {"score", "% of 4 episodes", *names} <= set(texts)
