"""Which run a command line continues (``resolved_logdir``) and with what config
(``resumed``), before torch is imported; a refusal names the folder and what it found."""

from __future__ import annotations

import copy
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, read_write

from dreamer.command_line import DICT_KEYS, composition_error, finish, load
from dreamer.config import GROUPS, RENAMED_KEYS, flatten, in_current_keys, resumable_keys, schema
from dreamer.envs import registry
from dreamer.errors import ConfigError
from dreamer.runtime.rotation import saved_steps

# Keys a resumed run may set anew (the schema marks them); every other is its run's.
RESUMABLE_KEYS = resumable_keys()
SAVED_CONFIG = "config.yaml"


def runs_folder(env) -> Path:
    """Where an env's runs go without ``run.logdir``: ``runs/<env.name>/``, or for a kind
    named by another key ``runs/gym/<env.id>/`` (``/`` and ``:`` as ``_``)."""
    label = registry.label(env)
    if label == env.name:
        return Path("runs") / env.name
    return Path("runs") / env.name / re.sub(r"[/:\\]", "_", str(label))


def run_folders(env) -> list[Path]:
    """This env's run directories, newest first: its ``runs_folder``'s and, for a kind
    named by another key, those of the older ``runs/<env.name>/<stamp>/`` layout."""
    folders = [p for p in runs_folder(env).glob("*") if p.is_dir()]
    key = registry.kind(env.name).label
    if key != "name":
        for folder in (Path("runs") / env.name).glob("*"):
            saved = folder / SAVED_CONFIG
            if saved.is_file() and OmegaConf.load(saved).get("env", {}).get(key) == env[key]:
                folders.append(folder)
    return sorted(folders, key=lambda p: p.name, reverse=True)  # <YYYYmmdd-HHMMSS>: newest first


def saved_run_steps(folder: Path) -> int | None:
    """The ``run.steps`` a run directory's saved config asks for (None: no config)."""
    path = folder / SAVED_CONFIG
    return OmegaConf.select(OmegaConf.load(path), "run.steps") if path.is_file() else None


def target_steps(cfg: DictConfig, typed: set[str]) -> Callable[[Path], int]:
    """A run's ``run.steps`` for a resume: the typed one, else its saved config's, else cfg's."""
    if "run.steps" in typed:
        return lambda folder: cfg.run.steps
    return lambda folder: saved_run_steps(folder) or cfg.run.steps


def latest_unfinished(folders: list[Path], target: Callable[[Path], int]) -> Path | None:
    """The first of ``folders`` whose latest checkpoint is short of ``target(folder)``."""
    for folder in folders:
        steps = saved_steps(folder)
        if steps and steps[-1] < target(folder):
            return folder
    return None


def env_text(env) -> str:
    """An env as a command line names it: ``env=gym (Pendulum-v1)``, ``env=crafter``."""
    label = registry.label(env)
    return f"env={env['name']}" + (f" ({label})" if label != env["name"] else "")


def commands() -> tuple[str, str]:
    """How this user starts and resumes a run (``make`` sets ``DREAMER_TERMINAL_JOB``)."""
    if os.environ.get("DREAMER_TERMINAL_JOB"):
        return "make train", "make resume ARGS=env=<name>"
    return "python -m dreamer.train", "python -m dreamer.train run.resume=latest env=<name>"


def nothing_to_resume(cfg: DictConfig, typed: set[str]) -> ConfigError:
    """``run.resume=latest`` finding no unfinished run: what is there, and what to type."""
    runs, (train, resume) = runs_folder(cfg.env), commands()
    done = [folder for folder in run_folders(cfg.env) if saved_steps(folder)]
    if not done:
        return ConfigError(
            f"nothing to resume under {runs}/: no run of {registry.label(cfg.env)} has a "
            f"checkpoint there; start one with {train}, or resume another env's with {resume}"
        )
    newest = done[0]
    wanted = target_steps(cfg, typed)(newest)
    runs_word = "run is" if len(done) == 1 else f"{len(done)} runs are"
    return ConfigError(
        f"nothing to resume under {runs}/: its {runs_word} finished (the newest, "
        f"{newest.name}, has {saved_steps(newest)[-1]:,} env steps of run.steps={wanted}); "
        f"train it longer with run.steps=<more> run.logdir={newest}, start a new run with "
        f"{train}, or resume another env's with {resume}"
    )


def resolved_logdir(cfg: DictConfig, typed: set[str] | None = None) -> Path:
    """``run.logdir`` if set, else with ``run.resume=latest`` this env's newest unfinished
    run, else a new ``<runs_folder>/<YYYYmmdd-HHMMSS>``. ``typed``: the keys the command
    line set (``typed_keys``); None (a sweep's job): every key."""
    if cfg.run.logdir:
        logdir = Path(cfg.run.logdir)
        if cfg.run.resume == "latest" and not saved_steps(logdir):
            raise ConfigError(
                f"run.resume=latest: {logdir} holds no checkpoint to resume; leave "
                "run.resume out to start a run there, or name a run directory with checkpoints"
            )
        return logdir
    if cfg.run.resume == "latest":
        typed = {"run.steps"} if typed is None else typed
        found = latest_unfinished(run_folders(cfg.env), target_steps(cfg, typed))
        if found is None:
            raise nothing_to_resume(cfg, typed)
        return found
    return runs_folder(cfg.env) / time.strftime("%Y%m%d-%H%M%S")


def with_logdir(cfg: DictConfig, logdir: Path) -> DictConfig:
    """The run's config as it saves it: ``run.logdir`` the folder it writes to."""
    cfg = copy.deepcopy(cfg)
    with read_write(cfg):
        cfg.run.logdir = str(logdir)
    return cfg


def typed_keys(cfg: DictConfig, overrides: list[str], defaults: DictConfig) -> set[str]:
    """The keys a command line set: each ``key=value``, all of a group it chose, and those
    differing from ``defaults`` (an empty command line's config: ``experiment=...``'s)."""
    chosen = leaves(OmegaConf.to_container(cfg))
    default = leaves(OmegaConf.to_container(defaults))
    typed = {key for key, value in chosen.items() if default.get(key) != value}
    for text in overrides:
        key = text.lstrip("+~").partition("=")[0]
        key = "logger.use" if key == "logger" else RENAMED_KEYS.get(key, key)
        if key in GROUPS:
            typed |= {name for name in chosen if name.startswith(f"{key}.")}
        else:
            typed.add(key)
    return typed


def resumable_text(env_name: str) -> str:
    """``RESUMABLE_KEYS`` in a line, by section: ``run.{steps, logdir, ...}``, and a
    section all of whose keys may change as ``section.*``."""
    keys = flatten(OmegaConf.to_container(schema(env_name)))

    def whole(prefix: str) -> bool:
        return all(k in RESUMABLE_KEYS for k in keys if k.startswith(f"{prefix}."))

    sections: dict[str, list[str]] = {}
    for key in RESUMABLE_KEYS:
        section, rest = key.split(".", 1)
        if whole(section):
            sections.setdefault(f"{section}.*", [])
            continue
        sub = rest.split(".", 1)[0]
        name = f"{sub}.*" if "." in rest and whole(f"{section}.{sub}") else rest
        names = sections.setdefault(section, [])
        if name not in names:
            names.append(name)
    return ", ".join(s if not n else f"{s}.{{{', '.join(n)}}}" for s, n in sections.items())


def leaves(node: dict) -> dict:
    """``flatten``, a dict-valued key (``env.kwargs``) one value."""
    flat = flatten(node)
    for key in DICT_KEYS:
        section, _, name = key.partition(".")
        if isinstance(node.get(section), dict) and name in node[section]:
            flat = {k: v for k, v in flat.items() if not k.startswith(f"{key}.")}
            flat[key] = node[section][name]
    return flat


def resumed(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """The continued run's saved config with the keys the command line set on top, so a
    resume repeats none of its overrides (else ``cfg``); a key a resume cannot change, or
    another env, is a ``ConfigError``. The caller validates it (``command_line.validated``)."""
    if not (cfg.run.logdir or cfg.run.resume == "latest"):
        return cfg
    if cfg.run.resume != "latest" and not (Path(cfg.run.logdir) / SAVED_CONFIG).is_file():
        return cfg  # a new run in a named folder: no second composition (the defaults')
    typed = typed_keys(cfg, overrides, load([], check=False))
    logdir = resolved_logdir(cfg, typed)
    if not (logdir / SAVED_CONFIG).is_file():
        return cfg
    stored = in_current_keys(OmegaConf.to_container(OmegaConf.load(logdir / SAVED_CONFIG)))
    before, after = leaves(stored), leaves(OmegaConf.to_container(cfg))
    env_key = f"env.{registry.kind(before['env.name']).label}" if "env.name" in before else None
    for key in {"env.name", env_key}:  # crafter's label is its name
        if key in typed and before.get(key) != after.get(key):
            raise ConfigError(
                f"run.logdir: {logdir} holds an {env_text(stored['env'])} run, not "
                f"{env_text(cfg.env)}: give a new run.logdir for this one, or leave env out "
                "to resume that run"
            )
    chosen = {text.partition("=")[0] for text in overrides}
    for key in sorted(typed):
        if key in RESUMABLE_KEYS or key not in after or before.get(key) == after[key]:
            continue
        group = key.split(".")[0]
        if group in chosen and group in GROUPS and f"{group}.name" in after:  # model=size1m
            key, theirs, ours = (
                group,
                f"{group}={before.get(f'{group}.name')}",
                f"{group}={after[f'{group}.name']}",
            )
        else:
            theirs, ours = repr(before.get(key)), repr(after[key])
        raise ConfigError(
            f"{key}: cannot change on resume of {logdir} (its run has {theirs}, this command "
            f"{ours}); a resume may change {resumable_text(cfg.env.name)}"
        )
    merged = saved(logdir / SAVED_CONFIG)
    for key in typed & set(after):
        OmegaConf.update(merged, key, after[key], merge=False)
    return with_logdir(finish(merged, check=False), logdir)


def check_resume(saved: dict, cfg: DictConfig) -> None:
    """Refuse a resume whose config differs outside ``RESUMABLE_KEYS`` (names the first key)."""
    before = flatten(in_current_keys(saved))
    after = flatten(OmegaConf.to_container(cfg))
    for key in sorted(set(before) | set(after)):
        if key in RESUMABLE_KEYS or before.get(key) == after.get(key):
            continue
        raise ConfigError(
            f"{key}: cannot change on resume ({before.get(key)!r} -> {after.get(key)!r}); "
            f"a resume may change {resumable_text(cfg.env.name)}"
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
