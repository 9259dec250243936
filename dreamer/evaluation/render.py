"""Figures and videos, drawn off the training loop by a pool of processes.

Renderers take plain arrays and lists (never live models) and a path; their files are
byte-identical inline or on the pool (fixed matplotlib backend and style, PNGs without
metadata, videos encoded single-threaded). A failed renderer is reported and the run goes
on; a pool a dead worker broke is replaced and its unfinished figures drawn again, once.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from dreamer.data import forkserver
from dreamer.runtime.cores import usable_cores
from dreamer.runtime.relaunches import Relaunches
from dreamer.runtime.signals import children_keep_signals, die_with_parent, stop_moment

log = logging.getLogger(__name__)

WORKERS_ENV = "DREAMER_RENDER_WORKERS"
PNG_METADATA = {"Software": None}  # matplotlib writes its version there otherwise


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcdefaults()
    plt.rcParams.update({"font.family": "DejaVu Sans", "font.size": 8, "figure.dpi": 100})
    return plt


def _save(figure, path: Path, **metadata: str) -> None:
    """Save the PNG with every label drawn on it as a JSON list in its ``Comment``."""
    from matplotlib.text import Text

    figure.draw_without_rendering()  # lays out the tick labels (savefig renders)
    texts = [text.get_text() for text in figure.findobj(Text) if text.get_text().strip()]
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, metadata=PNG_METADATA | {"Comment": json.dumps(texts)} | metadata)


def open_loop(path: Path, truth: np.ndarray, model: np.ndarray, context: int) -> None:
    """Rows: truth, model (the first ``context`` frames reconstructed), and each pixel's
    |truth - model| averaged over RGB on one 0-255 scale; columns: the [T, H, W, 3] steps."""
    plt = _pyplot()
    steps = truth.shape[0]
    figure, axes = plt.subplots(3, steps, figsize=(steps * 0.9 + 0.8, 3.0), squeeze=False)
    error = np.abs(truth.astype(np.int16) - model.astype(np.int16)).mean(axis=-1)
    for row, (name, frames) in enumerate((("truth", truth), ("model", model), ("error", error))):
        for t in range(steps):
            axis = axes[row, t]
            if row < 2:
                axis.imshow(frames[t], interpolation="nearest")
            else:
                shown = axis.imshow(
                    frames[t], interpolation="nearest", cmap="magma", vmin=0, vmax=255
                )
            axis.set_xticks([])
            axis.set_yticks([])
            if t == 0:
                axis.set_ylabel(name)
            if row == 0:
                axis.set_title(f"{'ctx' if t < context else 'imag'} {t}", fontsize=6)
    right = 1 - 0.8 / (steps * 0.9 + 0.8)  # the scale's margin; the frames keep one width
    figure.tight_layout(pad=0.2, rect=(0, 0, right, 1))
    row = axes[2, -1].get_position()
    scale = figure.colorbar(shown, cax=figure.add_axes((right + 0.005, row.y0, 0.006, row.height)))
    scale.set_label("|truth - model|\n(mean of RGB)", fontsize=6)
    scale.ax.tick_params(labelsize=6)
    _save(figure, path)
    plt.close(figure)


def curve(
    path: Path,
    series: dict[str, tuple[list[float], list[float]]],
    title: str,
    labels: dict[str, str] | None = None,
) -> None:
    """Lines of (x, y) per name, ``labels`` their legend entries (default: the names); the
    PNG's ``Description`` holds each line's point count as JSON."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 4))
    for name, (x, y) in series.items():
        label = (labels or {}).get(name, name)
        axis.plot(x, y, marker="o" if len(x) < 30 else None, markersize=4, label=label)
    axis.set_xlabel("env steps")
    axis.set_ylabel("return")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    _save(figure, path, Description=json.dumps({name: len(x) for name, (x, _) in series.items()}))
    plt.close(figure)


def bars(path: Path, names: list[str], values: list[float], title: str, xlabel: str = "%") -> None:
    """Horizontal bars of rates in %; all at 0, a note says so (else it reads as broken)."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 0.25 * len(names) + 1.2))
    axis.barh(range(len(names)), values)
    axis.set_yticks(range(len(names)), names)
    axis.invert_yaxis()
    axis.set_xlim(0, 100)  # rates: nothing achieved yet reads 0 of 100, not -0.04..0.04
    if not any(values):
        axis.text(50, (len(names) - 1) / 2, "none yet", ha="center", va="center", color="gray")
    axis.set_xlabel(xlabel)
    axis.set_title(title)
    figure.tight_layout()
    _save(figure, path)
    plt.close(figure)


def video(path: Path, frames: np.ndarray, fps: int = 16) -> Path:
    """[T, H, W, 3] uint8 frames as an MP4, or a GIF without imageio's ffmpeg plugin."""
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import imageio_ffmpeg  # noqa: F401

        target = path.with_suffix(".mp4")
        imageio.mimwrite(
            target,
            list(frames),
            fps=fps,
            codec="libx264",
            macro_block_size=1,
            ffmpeg_params=["-threads", "1", "-fflags", "+bitexact", "-flags:v", "+bitexact"],
        )
    except ImportError:
        target = path.with_suffix(".gif")
        imageio.mimwrite(target, list(frames), duration=1000 / fps, loop=0)
    return target


RENDERERS = {"open_loop": open_loop, "curve": curve, "bars": bars, "video": video}


def draw(kind: str, path: Path, arguments: dict) -> Path:
    """Draw; returns the file written (a video's suffix is chosen by ``video``)."""
    return RENDERERS[kind](Path(path), **arguments) or Path(path)


def _start_worker() -> None:
    """Workers leave Ctrl-C to the run, which drains the pool, and die with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    _pyplot()


def pool_size(configured: int | None) -> int:
    """``DREAMER_RENDER_WORKERS`` if set, else the configured size (None: min(cores, 16))."""
    value = os.environ.get(WORKERS_ENV)
    if value is None or value == "":
        return min(usable_cores(), 16) if configured is None else configured
    if not value.isdigit():
        raise ValueError(f"{WORKERS_ENV}: expected a worker count >= 0, got {value!r}")
    return int(value)


class RenderPool:
    """Draws figures inline (0 workers) or on workers forked from the run's forkserver,
    which has numpy and torch imported (faster to start), else spawned."""

    def __init__(self, workers: int, relaunches: Relaunches | None = None, on_file=None):
        """``on_file(path)``: called with each file drawn (e.g. to send it to trackers)."""
        self.workers = workers
        self.relaunches = relaunches if relaunches is not None else Relaunches()
        self.on_file = on_file
        self.failures: list[str] = []
        self._pending: list[tuple[Path, Future, tuple]] = []  # path, future, what to redraw
        self._starting: list[Future] = []  # the workers' start, until they are all up
        self._pool = self._new_pool() if workers else None

    def _new_pool(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("forkserver" if forkserver.serving() else "spawn")
        return ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker)

    def start(self) -> None:
        """Start every worker now, not waited for: they import matplotlib for seconds."""
        if self._pool is not None:
            with children_keep_signals():
                self._starting = [self._pool.submit(os.getpid) for _ in range(self.workers)]
                stop_moment("render_start")

    def _announce(self) -> None:
        """The workers' pids, once every one started (``start``)."""
        if self._starting and all(future.done() for future in self._starting):
            starting, self._starting = self._starting, []
            pids = {future.result() for future in starting if future.exception() is None}
            if pids:  # (none: the pool broke meanwhile, and its replacement says so)
                log.info("render worker pids: %s", " ".join(map(str, sorted(pids))))

    def submit(self, kind: str, path: Path, **arguments) -> None:
        if self._pool is None:
            try:
                written = draw(kind, path, arguments)
            except Exception as error:  # noqa: BLE001 - a figure must not end the run
                self._failed(path, error)
                return
            if self.on_file is not None:
                self.on_file(written)
            return
        self.poll()
        self._submit(Path(path), (kind, path, arguments), attempt=1)
        self.collect()

    def _submit(self, path: Path, work: tuple, attempt: int) -> None:
        try:
            with children_keep_signals():  # the pool starts workers on demand
                future = self._pool.submit(draw, *work)
        except BrokenProcessPool as error:  # a worker died since the last poll
            future = Future()
            future.set_exception(error)
        self._pending.append((path, future, (work, attempt)))

    def _failed(self, path: Path, error: BaseException) -> None:
        message = f"{path}: {type(error).__name__}: {error}"
        self.failures.append(message)
        log.error("render failed: %s", message)

    def poll(self) -> None:
        """Replace a pool a dead worker broke and report finished renders; cheap enough
        for every loop iteration."""
        if self._pool is None or not self._pool._broken:  # no public accessor
            self._announce()
            self.collect()
            return
        self._starting = []
        self.relaunches.replacing(
            "render", f"a render worker died ({self._pool._broken})", "the render pool"
        )
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()
        self.start()
        pending, self._pending = self._pending, []
        for path, future, (work, attempt) in pending:
            lost = not future.done() or future.cancelled()
            if lost or isinstance(future.exception(), BrokenProcessPool):
                if self.relaunches.again(attempt):
                    log.warning("drawing %s again", path)
                    self._submit(path, work, attempt + 1)
                else:
                    self._failed(path, BrokenProcessPool("its render worker died twice"))
            else:
                self._pending.append((path, future, (work, attempt)))
        self.collect()

    def collect(self, wait: bool = False) -> None:
        """Report finished (or, with ``wait``, all) renders."""
        still = []
        for path, future, work in self._pending:
            if wait or future.done():
                try:
                    written = future.result()
                except BrokenProcessPool:
                    if self._pool is None:
                        self._failed(path, BrokenProcessPool("the render pool was closed"))
                        continue
                    still.append((path, future, work))  # poll() draws it again
                    continue
                except Exception as error:  # noqa: BLE001
                    self._failed(path, error)
                    continue
                if self.on_file is not None:
                    self.on_file(written)
            else:
                still.append((path, future, work))
        self._pending = still

    def close(self) -> None:
        while self._pool is not None:
            self.collect(wait=True)
            if not self._pool._broken:
                break
            self.poll()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
