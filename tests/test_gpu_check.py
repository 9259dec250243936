"""The GPU check on the CPU: the wheels carried to the offline GPU machine are complete
for its CPython 3.12, every step of benchmarks/gpu_check.sh runs in its CPU form, and
what the check writes fits the limits on what comes back from that machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_report import limit_problems  # noqa: E402


@pytest.fixture(scope="module")
def wheels() -> Path:
    """``make gpu-wheels``: the folder is kept between runs, so this downloads only once."""
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_wheels.py", "build"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return ROOT / ".whl"


@pytest.mark.slow
def test_dry_run_passes_and_fits_the_limits(wheels, tmp_path):
    out = tmp_path / "out"
    # the script's own deadline ends it (and its steps) before the timeout below would
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "GPU_CHECK_SECONDS": "1700"}
    done = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,  # ~2.5 min on 2 idle cores; the steps' own limits are 20x the GPU's
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "pip resolves the project offline for cp312" in done.stdout
    report = json.loads((out / "gpu.json").read_text())
    steps = {"learner-tiny-2x8", "trainer", "atari", "collect"}  # "modes": the GPU's only
    assert {name: row["status"] for name, row in report["steps"].items()} == dict.fromkeys(
        steps, "ok"
    )
    assert report["dry_run"] and report["device"].startswith("cpu")
    modes = report["learner"]["tiny/2x8"]["modes"]
    assert set(modes) == {"ours", "fewer_starts"}
    assert all(mode["updates_per_s"] > 0 and mode["tflops"] > 0 for mode in modes.values())
    assert report["trainer"]["updates"] >= 10 and report["trainer"]["loss_finite"]
    assert report["atari"]["env_steps"] == 96 and report["atari"]["loss_finite"]
    assert report["collect"]["crafter"]["chunk64"] > 0
    assert sorted(p.name for p in out.iterdir()) == ["gpu.json", "log.txt", "summary.md"]


def test_wheel_check_names_a_missing_wheel(wheels, tmp_path):
    short = tmp_path / "whl"
    shutil.copytree(wheels, short)
    (missing,) = short.glob("torchrl-*.whl")
    missing.unlink()
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_wheels.py", "check", "--dir", str(short)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "torchrl: want 0.14.1, folder has none" in done.stdout
    assert "pip cannot resolve the project offline" in done.stdout


def test_limit_check_names_what_would_not_come_back(tmp_path):
    for i in range(8):
        (tmp_path / f"file{i}.txt").write_text("x")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "a" / "b" / "fine.txt").write_text("x")
    (tmp_path / "bad name.txt").write_text("x")
    problems = limit_problems(tmp_path)
    assert "a/b/c/deep.txt: more than 2 folders down" in problems
    assert not any("fine.txt" in problem for problem in problems)
    assert any(
        problem.startswith("bad name.txt: a name of other characters") for problem in problems
    )
    assert "11 files, more than 8" in problems


def test_videos_fall_back_to_gif_without_imageio_ffmpeg(tmp_path, monkeypatch):
    """The GPU machine carries no imageio-ffmpeg (68 MB): episode videos become GIFs."""
    import imageio.v2 as imageio
    import numpy as np

    from dreamer.evaluation.render import video

    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import raises ImportError
    colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255]], np.uint8)
    frames = np.stack([np.broadcast_to(colours[i % 4], (8, 8, 3)) for i in range(6)])
    frames[:, :4, :4] = 0  # a black corner: more than one colour per frame
    written = video(tmp_path / "episode.mp4", frames, fps=8)
    assert written == tmp_path / "episode.gif" and not (tmp_path / "episode.mp4").exists()
    read = np.stack([frame[..., :3] for frame in imageio.mimread(written)])
    np.testing.assert_array_equal(read, frames)
