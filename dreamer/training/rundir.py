"""A run directory made ready for training: created and checked writable, the resume
checked, a crash's leftovers cleaned up, the latest checkpoint's state. Which run
directory, and a resume's config: ``dreamer.training.resume``."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from omegaconf import OmegaConf

from dreamer.errors import ConfigError
from dreamer.outputs.logs import MetricsWriter
from dreamer.runtime import checkpoint, signals
from dreamer.training.resume import SAVED_CONFIG, check_resume

log = logging.getLogger("dreamer")


def make_run_dir(logdir: Path) -> None:
    """``run.logdir`` created if missing and checked writable, else a ``ConfigError``
    (the caller, ``dreamer.training.loop.run``, removes the folders it made)."""
    probe = logdir / f".write-check-{os.getpid()}"
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        blocker = next((p for p in (logdir, *logdir.parents) if p.exists()), logdir)
        if error.errno in (errno.EEXIST, errno.ENOTDIR) and blocker.is_file():
            why = f"{blocker} is a file, not a folder"
        elif error.errno == errno.ENOENT:  # e.g. /proc: the parent exists, takes nothing
            why = f"{blocker} does not take new folders"
        else:
            why = f"{error.strerror.lower() if error.strerror else error} ({blocker})"
        raise ConfigError(
            f"run.logdir: cannot use {logdir}: {why}; give a writable folder"
        ) from None


def prepare_run_dir(cfg, logdir: Path) -> dict | None:
    """Check a run directory for resuming; returns the checkpoint state, if any. Metrics
    lines past the checkpoint are dropped (no duplicated or missing steps); a changed
    config outside the resumable keys is refused."""
    saved_config = logdir / SAVED_CONFIG
    if saved_config.exists():
        check_resume(OmegaConf.to_container(OmegaConf.load(saved_config)), cfg)
    (logdir / signals.STOPPED_FILE).unlink(missing_ok=True)  # a stop of an earlier run
    for partial in checkpoint.remove_partial(logdir):
        log.warning("removed %s, a checkpoint write a crash interrupted", partial.name)
    found, state = checkpoint.newest_good(logdir)
    MetricsWriter.truncate(logdir, state["steps"]["env_steps"] if state else 0)
    OmegaConf.save(cfg, saved_config, resolve=True)
    if state:
        log.info("resuming from %s at env step %d", found.name, state["steps"]["env_steps"])
    return state
