"""From a command line to a run's frozen config: overrides checked, Hydra's compose, its
errors in one line, and the cross-field checks (the schema is ``dreamer/config.py``'s)."""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, read_write

from dreamer.config import (
    CONF_DIR,
    GROUPS,
    LOGGERS,
    RENAMED_KEYS,
    WARM_START_PARTS,
    Config,
    options,
    register_schema,
    schema_type,
)
from dreamer.envs import registry
from dreamer.errors import ConfigError, did_you_mean, first_line
from dreamer.schema import TYPE_NAMES, check_field, check_section

USAGE = (
    "usage: python -m dreamer.train [-h] [--cfg job] [-m] [group=option ...] "
    "[section.key=value ...]"
)


DICT_KEYS = ("env.kwargs",)


def checked_overrides(overrides: list[str]) -> list[str]:
    """Reject what Hydra would accept silently (``+new.key=1``) or explain badly; returns
    the rest, less ``experiment=null`` (the default, which Hydra's compose rejects)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, kept = OverridesParser.create(), []
    for text in overrides:
        if text.startswith("logger="):  # the documented shorthand for logger.use=[...]
            text = "logger.use=" + text.split("=", 1)[1]
        key, _, raw = text.lstrip("+~").partition("=")
        if key in RENAMED_KEYS:
            print(f"note: {key} is now {RENAMED_KEYS[key]}; read as that", file=sys.stderr)
            text = text.replace(key, RENAMED_KEYS[key], 1)
            key = RENAMED_KEYS[key]
        try:
            (ov,) = parser.parse_overrides([text])
        except OverrideParseException as e:
            detail = (str(e).splitlines()[1:2] or ["syntax error"])[0]
            raise ConfigError(
                f"{key}: bad override {text!r} ({detail}); expected key=value"
            ) from None
        key = ov.key_or_group
        if ov.package is not None:
            raise ConfigError(f"{key}@{ov.package}: package overrides are not supported")
        if ov.is_delete():
            raise ConfigError(f"{key}: deleting keys is not supported")
        if ov.is_sweep_override():
            raise ConfigError(f"{key}: expected one value, got {raw!r}")
        if key in GROUPS:
            value = ov.value()
            if key == "experiment" and value is None:
                continue
            if value not in options(key):
                allowed = ", ".join(options(key))
                hint = did_you_mean(str(value), options(key), f"{key}={{}}")
                raise ConfigError(f"{key}: unknown option {value!r}{hint}; allowed: {allowed}")
        elif "." not in key and (hint := did_you_mean(key, GROUPS, f"{{}}={raw}")):
            raise ConfigError(  # a group's name mistyped: its option is known
                f"{key}: unknown key{hint}; the groups are {', '.join(GROUPS)} (group=<option>)"
            )
        else:
            schema_type(key)
        if ov.is_add():  # every schema key and group already exists; '+' only errors in Hydra
            raise ConfigError(f"{key}: already defined; drop the '+' ({text.lstrip('+')})")
        kept.append(text)
    return kept


def check_value(override: str) -> tuple[str, Any]:
    """One ``section.key=value`` parsed, typed and range-checked against the schema alone
    (``dreamer.evaluate`` reads everything else from the run directory)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException
    from omegaconf.errors import ValidationError

    key, sep, raw = override.partition("=")
    if "." not in key or not sep:
        raise ConfigError(f"{override}: expected section.key=value")
    schema_type(key)
    section, name = key.split(".", 1)
    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
        node = OmegaConf.structured(typing.get_type_hints(Config)[section])
        node[name] = parsed.value()
    except OverrideParseException:
        raise ConfigError(f"{key}: bad value {raw!r}") from None
    except ValidationError:
        raise wrong_type(key, raw) from None
    field_ = next(
        f for f in dataclasses.fields(typing.get_type_hints(Config)[section]) if f.name == name
    )
    check_field(key, node[name], field_.metadata)
    return key, node[name]


def wrong_type(key: str, value: Any, env_name: str | None = None) -> ConfigError:
    kind = schema_type(key, env_name)
    kind = next((t for t in typing.get_args(kind) if t is not type(None)), kind)  # Optional
    return ConfigError(f"{key}: expected {TYPE_NAMES.get(kind, 'another type')}, got {value!r}")


def composition_error(e: Exception, env_name: str | None = None) -> ConfigError:
    """Turn a Hydra/OmegaConf exception into a one-line ConfigError."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause: BaseException | None = e  # the innermost OmegaConf error names the dotted key
    while cause is not None and not getattr(cause, "full_key", None):
        cause = cause.__cause__ or cause.__context__
    key = getattr(cause, "full_key", None)
    if not key:
        return ConfigError(first_line(e))
    if env_name is None and key.startswith("env."):  # the env section it was composing
        env_name = OmegaConf.select(getattr(cause, "parent_node", None) or {}, "name")
    if isinstance(cause, ConfigAttributeError | ConfigKeyError):  # e.g. stray key in a preset
        schema_type(key, env_name)  # raises the usual "unknown key; allowed keys ..." error
    if isinstance(cause, ValidationError):
        return wrong_type(key, cause.value, env_name)
    return ConfigError(f"{key}: {first_line(cause)}")


def _check_world(cfg: DictConfig, ranks: int) -> None:
    """``run.envs`` and ``replay.batch`` are the job's, split evenly across ``ranks``."""
    for key, value in (("run.envs", cfg.run.envs), ("replay.batch", cfg.replay.batch)):
        if value % ranks:
            raise ConfigError(
                f"{key}: split evenly across the {ranks} ranks of this job, so it must be a "
                f"multiple of {ranks}; got {value}"
            )


def _check_collector(collector: DictConfig, envs: int) -> None:
    inference = collector.inference
    max_batch = inference.max_batch or envs
    if inference.min_batch > max_batch:
        raise ConfigError(
            f"collector.inference.min_batch: must be <= the max batch ({max_batch}), "
            f"got {inference.min_batch}"
        )
    if envs % collector.envs_per_worker:
        raise ConfigError(
            f"collector.envs_per_worker: must divide run.envs ({envs}), "
            f"got {collector.envs_per_worker}"
        )
    if inference.static_batch and collector.envs_per_worker > 1:
        raise ConfigError(
            "collector.inference.static_batch: needs the process inference server, "
            "which collector.envs_per_worker > 1 rules out; allowed: false"
        )
    if collector.worker_affinity == "spread" and not hasattr(os, "sched_setaffinity"):
        raise ConfigError(
            "collector.worker_affinity: spread needs Linux CPU affinity; allowed here: none"
        )


def _check_learner(learner: DictConfig, length: int) -> None:
    """Combinations that would leave a loss term without data."""
    if learner.imag_last > length:
        raise ConfigError(
            f"learner.imag_last: must be <= replay.length ({length}), the steps a sequence "
            f"has to imagine from, got {learner.imag_last}"
        )
    if learner.imag_last == 1 and learner.loss_scales.repval:
        raise ConfigError(
            "learner.imag_last: 1 leaves learner.loss_scales.repval no replayed step to learn "
            "on (the last step has no successor); use 0 or >= 2, or set "
            "learner.loss_scales.repval=0"
        )


def _check_lists(cfg: DictConfig) -> None:
    """The list-valued keys: loggers and warm-start parts."""
    for name in cfg.logger.use:
        if name not in LOGGERS:
            raise ConfigError(f"logger: unknown logger {name!r}; allowed: {', '.join(LOGGERS)}")
    if "jsonl" not in cfg.logger.use:
        raise ConfigError(
            "logger: jsonl is required (resumes and reports read metrics.jsonl); "
            f"got {list(cfg.logger.use)}"
        )
    parts = list(cfg.run.from_checkpoint_parts)
    for part in parts:
        if part not in WARM_START_PARTS:
            raise ConfigError(
                f"run.from_checkpoint_parts: unknown part {part!r}; "
                f"allowed: {', '.join(WARM_START_PARTS)}"
            )
    if "optimizer" in parts and not {"world_model", "actor", "critic"} <= set(parts):
        raise ConfigError(
            "run.from_checkpoint_parts: optimizer needs world_model, actor and critic too "
            f"(its moments belong to all their weights); got {parts}"
        )
    source = cfg.run.from_checkpoint
    if source is not None and not Path(source).exists():
        raise ConfigError(
            f"run.from_checkpoint: {source}: no such checkpoint file or run directory"
        )


def validated(cfg: DictConfig) -> DictConfig:
    """``cfg`` checked for this job's world (``WORLD_SIZE`` ranks); ``ConfigError`` else."""
    from dreamer.runtime.world import World

    with read_write(cfg):  # a tristate key's boolean is written as its name
        _validate(cfg, World.from_environment().size)
    return cfg


def _validate(cfg: DictConfig, ranks: int) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing == ["env.id"]:
        raise ConfigError(f"env.id: required for env={cfg.env.name}; e.g. env.id=CartPole-v1")
    if missing:
        raise ConfigError(f"{missing[0]}: missing value; set it with {missing[0]}=...")
    for section in typing.get_type_hints(Config):
        check_section(section, OmegaConf.get_type(cfg[section]), cfg[section])
    _check_world(cfg, ranks)
    m, r, envs = cfg.model, cfg.replay, cfg.run.envs // ranks
    if m.deter % m.blocks or m.hidden % m.blocks:
        raise ConfigError(
            f"model.blocks: must divide model.deter ({m.deter}) and model.hidden ({m.hidden}),"
            f" got {m.blocks}"
        )
    if r.size < r.length * cfg.run.envs:
        raise ConfigError(
            f"replay.size: must be >= replay.length * run.envs ({r.length} * {cfg.run.envs}"
            f" = {r.length * cfg.run.envs}), got {r.size}"
        )
    _check_collector(cfg.collector, envs)
    _check_learner(cfg.learner, r.length)
    _check_lists(cfg)


def load(overrides: list[str], check: bool = True) -> DictConfig:
    """Compose conf/config.yaml with Hydra-style ``overrides``, validate, derive, freeze.
    What the machine must offer (CUDA, packages) is checked where needed, not here."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = checked_overrides(list(overrides))
    # Hydra merges a dict override into the existing (struct) dict and refuses new keys:
    # a dict-valued key (env.kwargs) is set after composition instead, replacing it whole.
    dict_values = {}
    for text in [t for t in overrides if t.partition("=")[0] in DICT_KEYS]:
        overrides.remove(text)
        (parsed,) = OverridesParser.create().parse_overrides([text])
        key, value = parsed.key_or_group, parsed.value()
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, e.g. {key}={{max_episode_steps: 100}}")
        dict_values[key] = value
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base=None, config_dir=str(CONF_DIR)):
            composed = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise composition_error(e) from None
    finally:
        GlobalHydra.instance().clear()
    return finish(composed, dict_values, check)


def finish(
    composed: DictConfig,
    dict_values: Mapping[str, Any] = {},  # noqa: B006
    check: bool = True,
) -> DictConfig:
    """A typed config (``load``'s, a sweep job's or ``resume.saved``'s) as the run's: the
    schema's sections only, ``dict_values`` set whole, validated and frozen. An
    ``env.name`` set apart from its ``env=`` option is refused: the option types ``env``."""
    from omegaconf.errors import OmegaConfBaseException

    env_name = composed.env.name
    if OmegaConf.get_type(composed.env) is not registry.settings(env_name):
        raise ConfigError(f"env.name: set by env=<option>, not on its own; got {env_name!r}")
    cfg = OmegaConf.masked_copy(composed, list(typing.get_type_hints(Config)))
    try:
        for key, value in dict_values.items():
            OmegaConf.update(cfg, key, value, merge=False)
    except OmegaConfBaseException as e:
        raise composition_error(e, env_name) from None
    if check:  # a resume's config is checked once it is its run's (dreamer.train)
        validated(cfg)
    OmegaConf.set_struct(cfg, True)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def parse_args(
    argv: list[str],
    usage_text: str | Callable[[], str],
    allowed: tuple[str, ...] | None = None,
    positional: str | None = None,
    cfg_flag: bool = False,
) -> tuple[list[str], str | None]:
    """The command-line parser of train, evaluate and export: ``key=value`` overrides (of
    ``allowed`` keys, when given; a bare word is ``positional=word``), ``-h`` and, with
    ``cfg_flag``, ``--cfg job``. Returns (overrides, the --cfg value or None)."""
    overrides, show = [], None
    flags = "--cfg job, -h/--help" if cfg_flag else "-h/--help"
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            print(usage_text if isinstance(usage_text, str) else usage_text())
            sys.exit(0)
        if cfg_flag and arg in ("--cfg", "-c"):
            show = next(args, "")
        elif cfg_flag and arg.startswith("--cfg="):
            show = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise ConfigError(f"{arg}: unknown flag; allowed: {flags}")
        elif "=" not in arg and positional:
            overrides.append(f"{positional}={arg}")
        else:
            overrides.append(arg)
    if show not in (None, "job"):
        raise ConfigError(f"--cfg: unknown option {show!r}; allowed: job")
    for override in overrides if allowed is not None else []:
        key = override.partition("=")[0]
        if key not in allowed:
            raise ConfigError(f"{key}: not a key of this command; allowed: {', '.join(allowed)}")
    return overrides, show
