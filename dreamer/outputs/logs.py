"""Run outputs: ``metrics.jsonl``, TensorBoard, trackers (``trackers.py``), progress bar."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch
from torchrl.record.loggers import TensorboardLogger
from tqdm import tqdm

from dreamer.runtime.files import jsonl_rows, replace_text

log = logging.getLogger("dreamer")


def setup_logging(rank: int = 0) -> None:
    """Rank 0 logs our INFO lines; other ranks (tagged) and libraries log warnings and errors."""
    tag = f"[rank {rank}] " if rank else ""
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    logging.getLogger("dreamer").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    # torchrl logs its transport choice at INFO; keep it, silence the rest of its chatter.
    # Its own handler colours lines with ANSI codes (into log files too): ours instead.
    torchrl = logging.getLogger("torchrl")
    torchrl.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for handler in list(torchrl.handlers):
        torchrl.removeHandler(handler)
    torchrl.propagate = True


class OutputError(OSError):
    """A run output could not be written (a full disk, a quota): the run stops."""


class ResumedTensorboard(TensorboardLogger):
    """torchrl's ``TensorboardLogger`` whose writer purges the events a killed run wrote
    past the checkpoint its resume goes on from (``start``), which would show twice."""

    def __init__(self, exp_name: str, log_dir: str, start: int = 0):
        self.start = start  # read by _create_experiment, which torchrl's __init__ calls
        super().__init__(exp_name, log_dir)

    def _create_experiment(self):
        from torch.utils.tensorboard import SummaryWriter

        folder = os.path.join(self.log_dir, self.exp_name)
        return SummaryWriter(log_dir=folder, purge_step=self.start + 1)


class MetricsWriter:
    """One JSON line per log interval, its scalars mirrored to TensorBoard and trackers."""

    def __init__(self, cfg, logdir: Path, start: int = 0):
        """The outputs ``logger.use`` names (``metrics.jsonl`` always). ``start``: the env
        step a resumed run goes on from; its metrics.jsonl holds no row past it
        (``truncate``) and TensorBoard hides the events past it."""
        from omegaconf import OmegaConf

        from dreamer.outputs.trackers import start_trackers

        use = list(cfg.logger.use)
        config = OmegaConf.to_container(cfg, resolve=True)
        self.trackers = start_trackers(use, logdir, cfg.logger, config)
        self.path = logdir / "metrics.jsonl"
        self.file = self.path.open("a", encoding="utf-8")
        self.tensorboard = None
        if "tensorboard" in use:  # torchrl's logger: events under <logdir>/tensorboard
            self.tensorboard = ResumedTensorboard("tensorboard", str(logdir), start)

    def log_file(self, path: Path) -> None:
        for tracker in self.trackers:
            tracker.file(Path(path))

    @staticmethod
    def truncate(logdir: Path, last_step: int) -> None:
        """Drop the lines past the checkpoint at ``last_step`` (a resume writes them again)."""
        path = logdir / "metrics.jsonl"
        if not path.exists():
            return
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if (step := _step(line)) is not None and step <= last_step]
        if len(kept) != len(lines):
            replace_text(path, "".join(kept))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        clean = {
            key: (value if math.isfinite(value) else None) if isinstance(value, float) else value
            for key, value in metrics.items()
        }
        # the loop gives its interval's end; other rows get the moment they are written
        clean.setdefault("timestamp", time.time())
        try:
            self.file.write(json.dumps(clean, sort_keys=True) + "\n")
            self.file.flush()
        except OSError as error:  # a cut line is dropped by the resume's truncate
            raise OutputError(f"{self.path}: {error.strerror or error}") from None
        if self.tensorboard is not None:
            try:
                for key, value in metrics.items():
                    if isinstance(value, int | float) and math.isfinite(value):
                        self.tensorboard.log_scalar(key, value, step)
            except OSError as error:  # raised again from TensorBoard's writer thread
                folder = Path(self.tensorboard.log_dir)
                raise OutputError(f"{folder}: {error.strerror or error}") from None
        for tracker in self.trackers:
            tracker.metrics(step, metrics)

    def close(self) -> None:
        """Closes every output; one that cannot flush (a full disk) is logged."""
        closers = [self.file.close]
        if self.tensorboard is not None:
            closers.append(self.tensorboard.experiment.close)
        for close in [*closers, *(tracker.close for tracker in self.trackers)]:
            try:
                close()
            except OSError as error:
                log.error("closing the run's outputs: %s", error)


def has_eval_row(logdir: Path, step: int) -> bool:
    """Has metrics.jsonl the evaluation row of env step ``step``?"""
    rows = jsonl_rows(logdir / "metrics.jsonl")
    return any(row.get("env_steps") == step and "eval/return" in row for row in rows)


def _step(line: str) -> int | None:
    """The line's ``env_steps``; None for a line cut short by a crash mid-write."""
    if not line.endswith("\n"):
        return None
    try:
        return json.loads(line)["env_steps"]
    except json.JSONDecodeError:
        return None


class IntervalMeans:
    """Means over a log interval of the learner's scalar losses, summed on their device
    and read once per row: a ``float()`` per update would wait for the device each time."""

    def __init__(self):
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}

    def add(self, values: dict[str, torch.Tensor]) -> None:
        for key, value in values.items():
            value = value.detach().float()
            if key in self._sums:
                self._sums[key] += value
            else:
                self._sums[key] = value.clone()  # CUDA-graph outputs are overwritten
            self._counts[key] = self._counts.get(key, 0) + 1

    def flush(self) -> dict[str, float]:
        if not self._sums:
            return {}
        keys = list(self._sums)
        sums = torch.stack([self._sums[key] for key in keys]).cpu()  # the one device sync
        counts = torch.tensor([self._counts[key] for key in keys], dtype=sums.dtype)
        self._sums, self._counts = {}, {}
        return dict(zip(keys, (sums / counts).tolist()))


class Rates:
    """Env steps and updates per second since the previous metrics row."""

    def __init__(self, env_steps: int, updates: int):
        self.time, self.env_steps, self.updates = time.perf_counter(), env_steps, updates

    def __call__(self, env_steps: int, updates: int) -> dict[str, float]:
        now = time.perf_counter()
        elapsed = max(now - self.time, 1e-9)
        rates = {
            "env_steps_per_s": (env_steps - self.env_steps) / elapsed,
            "updates_per_s": (updates - self.updates) / elapsed,
        }
        self.time, self.env_steps, self.updates = now, env_steps, updates
        return rates


class Progress:
    """tqdm bar over env steps, updates, their mean rates and the ETA (updates left times
    seconds per update), not tqdm's rate and ETA: those stall and swing with update bursts."""

    def __init__(
        self,
        total: int,
        initial: int = 0,
        enabled: bool = True,
        updates: int = 0,
        clock=time.perf_counter,
    ):
        """``clock``: seconds, for the rates and the ETA (a test's own clock)."""
        self.clock = clock
        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="step",
            dynamic_ncols=True,
            disable=not enabled,
            file=sys.stderr,
            miniters=0,  # tqdm's adaptive default skips the redraws of update bursts
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
        )
        self.started = clock()
        self.initial = initial
        self.first_updates = updates  # a resumed run's, so its rate counts only its own
        self.first_update: tuple[float, int] | None = None  # (time, updates) at the first
        self.total_updates = 0.0  # the loop's ``expect`` says, before any redraw

    def expect(self, total_updates: float) -> None:
        """The updates the run will have made at ``run.steps``, as the schedule says now."""
        self.total_updates = total_updates

    def update(self, env_steps: int, updates: int) -> None:
        if self.bar.disable:
            return
        now = self.clock()
        if self.first_update is None and updates > self.first_updates:
            self.first_update = (now, updates)
        elapsed = max(now - self.started, 1e-9)
        shown = {  # in this order (keywords would be sorted)
            "step_s": f"{(env_steps - self.initial) / elapsed:.2f}",
            "eta": self._eta(now, env_steps, updates),
            "upd": updates,
            "upd_s": f"{(updates - self.first_updates) / elapsed:.2f}",
        }
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(env_steps - self.bar.n)  # a redraw when tqdm's interval passed

    def _eta(self, now: float, env_steps: int, updates: int) -> str:
        if self.total_updates - updates < 1:
            steps_per_s = (env_steps - self.initial) / max(now - self.started, 1e-9)
            left = (self.bar.total - env_steps) / steps_per_s if steps_per_s else None
        elif self.first_update is not None and updates > self.first_update[1]:
            per_update = (now - self.first_update[0]) / (updates - self.first_update[1])
            left = (self.total_updates - updates) * per_update
        else:
            left = None  # updates to come, none timed yet
        return "?" if left is None else tqdm.format_interval(max(left, 0))

    def close(self) -> None:
        self.bar.close()
