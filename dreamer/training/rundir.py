"""Run directories: where a run writes (``resolved_logdir``: a new one, or with
``run.resume=latest`` this env's newest unfinished one), what a resume may change
(``RESUMABLE_KEYS``), a saved config read back (``saved``), and a directory made ready
for training: the resume checked, what a crash left behind cleaned up, the latest
checkpoint's state."""

from __future__ import annotations

import copy
import dataclasses
import errno
import logging
import os
import re
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, read_write

from dreamer.command_line import composition_error
from dreamer.config import (
    EvalConfig,
    InferenceConfig,
    MlflowConfig,
    WandbConfig,
    flatten,
    in_current_keys,
    schema,
)
from dreamer.envs import registry
from dreamer.errors import ConfigError
from dreamer.outputs.logs import MetricsWriter
from dreamer.runtime import checkpoint, signals

log = logging.getLogger("dreamer")


def make_run_dir(logdir: Path) -> None:
    """``run.logdir`` created if missing and checked writable (a file is written there
    and removed). Refused in one line (``ConfigError``) when it is a file, lies under
    one, or cannot be created or written (read-only, immutable, no permission, /proc);
    the caller removes the folders it made (``dreamer.train.main``, as for any refusal)."""
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
    """Check a run directory for resuming; returns the checkpoint state, if any.

    Metrics lines past the checkpoint are dropped so a resumed run has no duplicated
    or missing steps; a changed config outside the resumable keys is refused."""
    saved_config = logdir / "config.yaml"
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


def runs_folder(env) -> Path:
    """Where an env's runs go without ``run.logdir``: ``runs/<env.name>/``, and for a
    kind that names its env by another key (gym: ``env.id``) ``runs/gym/<env.id>/``
    (``/`` and ``:`` of it as ``_``): the folder names the env, as the run's lines do."""
    label = registry.label(env)
    if label == env.name:
        return Path("runs") / env.name
    return Path("runs") / env.name / re.sub(r"[/:\\]", "_", str(label))


def resolved_logdir(cfg: DictConfig) -> Path:
    """``run.logdir`` if set (with ``run.resume=latest``: one holding a checkpoint), else
    with ``run.resume=latest`` the newest unfinished run of this env (``runs_folder``),
    else a new ``<runs_folder>/<YYYYmmdd-HHMMSS>``."""
    if cfg.run.logdir:
        logdir = Path(cfg.run.logdir)
        if cfg.run.resume == "latest" and not checkpoint.saved_steps(logdir):
            raise ConfigError(
                f"run.resume=latest: {logdir} holds no checkpoint to resume; allowed: "
                "never (a new run there), or run.logdir=<a run directory with checkpoints>"
            )
        return logdir
    runs = runs_folder(cfg.env)
    if cfg.run.resume == "latest":
        found = latest_unfinished(run_folders(cfg.env), cfg.run.steps)
        if found is None:
            raise ConfigError(
                f"run.resume=latest: no run under {runs}/ has a checkpoint short of "
                f"run.steps={cfg.run.steps}; allowed: never (a new run), or run.logdir=<dir>"
            )
        return found
    return runs / time.strftime("%Y%m%d-%H%M%S")


def with_logdir(cfg: DictConfig, logdir: Path) -> DictConfig:
    """The run's config as it saves it: ``run.logdir`` the folder it writes to."""
    cfg = copy.deepcopy(cfg)
    with read_write(cfg):
        cfg.run.logdir = str(logdir)
    return cfg


def run_folders(env) -> list[Path]:
    """The run directories of this env: those in its ``runs_folder``, and for a kind
    named by another key those a run before 2026-12-06 wrote to
    ``runs/<env.name>/<YYYYmmdd-HHMMSS>/`` with this env (its ``config.yaml`` says)."""
    folders = [p for p in runs_folder(env).glob("*") if p.is_dir()]
    key = registry.kind(env.name).label
    if key != "name":
        for folder in (Path("runs") / env.name).glob("*"):
            saved = folder / "config.yaml"
            if saved.is_file() and OmegaConf.load(saved).get("env", {}).get(key) == env[key]:
                folders.append(folder)
    return folders


def latest_unfinished(folders: list[Path], steps: int) -> Path | None:
    """The newest of the run directories ``folders`` whose latest checkpoint (its name
    holds its env step) is short of ``steps``."""
    for folder in sorted(folders, key=lambda p: p.name, reverse=True):  # <YYYYmmdd-HHMMSS>
        saved = checkpoint.saved_steps(folder)
        if saved and saved[-1] < steps:
            return folder
    return None


# Keys a resumed run may change; everything else must match the run directory's config.
RESUMABLE_KEYS = (
    "run.steps",
    "run.logdir",
    "run.resume",
    "run.log_every",
    "run.log_seconds",
    "run.save_every",
    "run.keep",
    "run.save_failures",
    "run.progress",
    "run.gc_freeze",
    "collector.sync_every",
    "collector.push_timeout",
    "collector.threads",
    "collector.envs_per_worker",
    "collector.pace",
    "collector.worker_affinity",
    *(f"collector.inference.{f.name}" for f in dataclasses.fields(InferenceConfig)),
    "learner.threads",
    "learner.device",
    "learner.precision",
    "learner.compile",
    "learner.cudagraph",
    *(f"eval.{f.name}" for f in dataclasses.fields(EvalConfig)),
    "run.from_checkpoint",  # used when a run starts; a resume ignores them
    "run.from_checkpoint_parts",
    "logger.use",
    *(f"logger.mlflow.{f.name}" for f in dataclasses.fields(MlflowConfig)),
    *(f"logger.wandb.{f.name}" for f in dataclasses.fields(WandbConfig)),
)


def check_resume(saved: dict, cfg: DictConfig) -> None:
    """Refuse to resume a run directory under a config that differs outside
    ``RESUMABLE_KEYS``; the message names the first differing key."""
    before = flatten(in_current_keys(saved))
    after = flatten(OmegaConf.to_container(cfg))
    for key in sorted(set(before) | set(after)):
        if key in RESUMABLE_KEYS or before.get(key) == after.get(key):
            continue
        raise ConfigError(
            f"{key}: cannot change on resume ({before.get(key)!r} -> {after.get(key)!r}); "
            f"allowed to change: {', '.join(RESUMABLE_KEYS)}"
        )


def saved(path: Path) -> DictConfig:
    """A run directory's ``config.yaml`` typed by the schema (``dreamer.evaluate``); one
    that does not fit it (another version's keys) is a ``ConfigError`` naming the key."""
    from omegaconf.errors import OmegaConfBaseException

    stored = OmegaConf.create(in_current_keys(OmegaConf.to_container(OmegaConf.load(path))))
    env_name = OmegaConf.select(stored, "env.name")
    try:
        try:
            return OmegaConf.merge(schema(env_name), stored)
        except OmegaConfBaseException as e:
            raise composition_error(e, env_name) from None
    except ConfigError as error:
        raise ConfigError(f"{path}: not a config this dreamer reads ({error})") from None
