"""Configuration: one structured schema, YAML presets in ``conf/``, strict validation.

``load(overrides)`` composes ``conf/config.yaml`` with Hydra's compose API, type-checks
against the dataclass schema below (struct mode), range/choice-checks each field from its
``check``/``choices`` metadata, derives ``run.logdir`` and returns a read-only DictConfig.
Every user error becomes a ``ConfigError`` whose message is one line naming the dotted key.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import sys
import time
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dreamer.envs import registry
from dreamer.envs.registry import EnvSettings
from dreamer.errors import ConfigError
from dreamer.schema import TRISTATE, check_field, check_section
from dreamer.schema import TYPE_NAMES as _KINDS
from dreamer.schema import f as _f
from dreamer.schema import strings as _list

# the YAML presets: conf/ at the top of a checkout, the package dreamer.conf in a wheel
_HERE = Path(__file__).resolve().parent
CONF_DIR = _HERE / "conf" if (_HERE / "conf").is_dir() else _HERE.parent / "conf"
GROUPS = ("env", "model", "experiment")  # config groups: directories under conf/
USAGE = (
    "usage: python -m dreamer.train [-h] [--cfg job] [-m] [group=option ...] "
    "[section.key=value ...]"
)


WARM_START_PARTS = ("world_model", "actor", "critic", "optimizer")
LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow")


@dataclass
class ModelConfig:
    """The networks' sizes: ``model=<preset>`` sets them (DreamerV3's size1m to size400m)."""

    name: str = _f()
    """the preset's name (set by model=)"""
    deter: int = _f(check=">= 1")
    """width of the RSSM's deterministic (GRU) state"""
    hidden: int = _f(check=">= 1")
    """width of the RSSM's hidden layers around the GRU"""
    stoch: int = _f(32, ">= 1")
    """categorical variables in the stochastic state"""
    classes: int = _f(check=">= 2")
    """classes of each categorical variable (the stochastic state: stoch x classes one-hots)"""
    cnn_depth: int = _f(check=">= 1")
    """channels of the image encoder's first convolution (doubled per stage)"""
    cnn_strided: bool = _f(True)
    """image CNNs: true = torchrl's (kernel-5 stride-2 convolutions); false = the
    DreamerV3 author's default (stride 1 with 2x2 max-pools, nearest upsampling in the
    decoder: 4x the convolution FLOPs; needs an even cnn_depth, deter a multiple of 8)"""
    units: int = _f(check=">= 1")
    """width of the MLPs (encoder, decoder, heads, actor, critic)"""
    layers: int = _f(2, ">= 1")
    """MLP depth of the encoder, decoder, actor and critic"""
    head_layers: int = _f(1, ">= 1")
    """MLP depth of the reward and continue heads (official rewhead/conhead.layers: 1)"""
    blocks: int = _f(8, ">= 1")
    """blocks of the block-diagonal GRU; must divide deter and hidden"""
    unimix: float = _f(0.01, "[0, 1)")
    """share of a uniform distribution mixed into every categorical (latents, actions)"""
    bins: int = _f(255, ">= 3")
    """bins of the two-hot (symlog) reward and value distributions"""


@dataclass
class RunConfig:
    """How long a run goes, where it writes, and how often."""

    steps: int = _f(1_000_000, ">= 1")
    """env steps in total"""
    envs: int = _f(4, ">= 1")
    """env workers (the whole job's: split across ranks)"""
    train_ratio: float = _f(512.0, "> 0")
    """replayed steps per env step: updates per env step = train_ratio / (replay.batch x
    replay.length)"""
    train_starts: int = _f(1024, ">= 0")
    """env steps collected before the first update"""
    seed: int = _f(0)
    """seed of the weights, the env workers and the replay sampling"""
    logdir: str | None = _f(None)
    """where the run writes; none = runs/<env.name>/<YYYYmmdd-HHMMSS> (env=gym:
    runs/gym/<env.id>/<YYYYmmdd-HHMMSS>)"""
    resume: str = _f("never", choices=("never", "latest"))
    """latest: without run.logdir, continue the newest unfinished run of this env (under
    runs/<env.name>/; make resume) instead of starting a new one"""
    log_every: int = _f(1000, ">= 1")
    """env steps between metrics rows"""
    log_seconds: float = _f(300.0, "> 0")
    """wall seconds a metrics row waits at most (when new env steps came), whatever
    log_every"""
    save_every: float = _f(900.0, "> 0")
    """seconds between checkpoints"""
    keep: int = _f(3, ">= 1")
    """checkpoints kept"""
    save_failures: int = _f(3, ">= 1")
    """checkpoint writes failing in a row (a full disk, a quota) before the run stops
    with exit 1; the last good checkpoint stays the one a rerun resumes from"""
    progress: bool = _f(True)
    """the progress bar (env steps, updates, ETA) on stderr"""
    gc_freeze: bool = _f(True)
    """gc.freeze() the set-up's heap for the loop (false: to measure what it saves)"""
    from_checkpoint: str | None = _f(None)
    """a new run starts from the weights of this run directory (its latest checkpoint)
    or checkpoint file"""
    from_checkpoint_parts: list[str] = _list(["world_model", "actor", "critic"])
    """what a warm start takes: any of world_model, actor, critic, optimizer (the last
    needs the other three)"""


@dataclass
class ReplayConfig:
    """The replay buffer: one stream per env worker, sampled as windows."""

    size: int = _f(1_000_000, ">= 1")
    """capacity in transitions (split evenly across workers); RAM and disk follow the
    fill, and a capacity the machine cannot hold exits 2 at start"""
    batch: int = _f(16, ">= 1")
    """sequences per update (the whole job's: split across ranks)"""
    length: int = _f(64, ">= 2")
    """steps per sequence"""
    storage: str = _f("memory", choices=("memory", "disk"))
    """where completed chunks are read from: memory (RAM) or disk (memory-mapped files
    under <run.logdir>/replay; resident memory stays flat)"""


@dataclass
class InferenceConfig:
    """The inference process that serves the acting policy to the env workers."""

    max_batch: int = _f(0, ">= 0")
    """requests per policy forward; 0 = every env (run.envs)"""
    min_batch: int = _f(1, ">= 1")
    """requests to wait for once the first has arrived"""
    timeout: float = _f(0.001, ">= 0")
    """seconds to wait for min_batch before serving a partial batch"""
    static_batch: bool = _f(False)
    """CUDA-graph the served policy at max_batch (CUDA only)"""


@dataclass
class CollectorConfig:
    """torchrl's AsyncBatchedCollector: env workers, inference, chunks to the driver."""

    chunk: int = _f(64, ">= 1")
    """transitions per message from each worker to the driver"""
    sync_every: int = _f(10, ">= 1")
    """learner updates between weight pushes to the inference process"""
    push_timeout: float = _f(5.0, "> 0")
    """seconds a weight push waits for the inference process; a starved one (logged)
    gets the next push"""
    threads: int = _f(1, ">= 1")
    """torch threads of the inference process"""
    envs_per_worker: int = _f(1, ">= 1")
    """envs per worker process (must divide run.envs); > 1: torchrl serves the policy
    from a driver thread and does not chunk"""
    worker_affinity: str = _f("none", choices=("none", "spread"))
    """spread: env worker i pinned to the i-th allowed core (Linux)"""
    pace: str = _f("auto", choices=("auto", "stop", "nice", "pause", "none"))
    """collection while the learner updates: stop = env workers and inference stopped
    (SIGSTOP) through each update burst, nice = at the lowest CPU priority, pause =
    parked by torchrl (waking every 10 ms), none = running beside it; auto = stop with a
    CPU learner on 4 usable cores or fewer, else none (a GPU learner: collection overlaps)"""
    inference: InferenceConfig = field(default_factory=InferenceConfig)


@dataclass
class LossScales:
    """Weight of each DreamerV3 loss term in the total: the official ``agent.loss_scales``."""

    rec: float = _f(1.0, ">= 0")
    """observation reconstruction (the decoder), all keys together"""
    rew: float = _f(1.0, ">= 0")
    """reward prediction (two-hot)"""
    con: float = _f(1.0, ">= 0")
    """continue prediction (the episode goes on)"""
    dyn: float = _f(1.0, ">= 0")
    """dynamics KL: the prior learns to predict the posterior"""
    rep: float = _f(0.1, ">= 0")
    """representation KL: the posterior stays predictable"""
    policy: float = _f(1.0, ">= 0")
    """actor: REINFORCE on imagined returns, entropy bonus included"""
    value: float = _f(1.0, ">= 0")
    """critic on imagined returns, its slow-critic term included"""
    repval: float = _f(0.3, ">= 0")
    """critic on replayed states (its gradient reaches the RSSM)"""


@dataclass
class LearnerConfig:
    """The update: device, precision, compilation, and DreamerV3's learning constants."""

    device: str = _f("auto", choices=("auto", "cpu", "cuda"))
    """where the learner runs; auto = cuda when a GPU is visible"""
    precision: str = _f("auto", choices=("auto", "bf16", "fp32"))
    """bf16 = the loss under bf16 autocast, without loss scaling (CUDA, or a CPU with
    bf16 instructions); auto = bf16 on CUDA, fp32 on the CPU"""
    compile: str = _f("auto", choices=TRISTATE)
    """torch.compile the update's step functions (RSSM steps, the losses after
    imagination), cached under $XDG_CACHE_HOME/dreamer; auto = on CUDA (the long CPU
    presets set true)"""
    cudagraph: str = _f("auto", choices=TRISTATE)
    """CUDA-graph the update's forward and backward; auto = on CUDA"""
    lr: float = _f(4e-5, "> 0")
    """learning rate of world model, actor and critic (the official 4e-5)"""
    warmup: int = _f(1000, ">= 0")
    """updates over which the learning rate rises linearly from 0"""
    horizon: int = _f(15, ">= 1")
    """imagined steps per start state"""
    imag_last: int = _f(0, ">= 0")
    """imagine from the last K replayed steps of every sequence (batch x K starts; 0 =
    every step); the replay-value term learns on the same steps"""
    threads: int = _f(0, ">= 0")
    """torch threads of the learner; 0 = the cores collection leaves it on the CPU
    (every usable core when collection is paced), torch's default on CUDA"""
    grad_clip: float = _f(0.3, "> 0")
    """adaptive gradient clipping: a gradient's norm is held under this times its
    parameter's norm"""
    return_horizon: float = _f(333.0, "> 1")
    """the return's horizon in steps: discount = 1 - 1 / return_horizon (0.997)"""
    lmbda: float = _f(0.95, "[0, 1]")
    """lambda of the lambda-returns the actor and critic learn from"""
    entropy: float = _f(3e-4, ">= 0")
    """weight of the actor's entropy bonus"""
    loss_scales: LossScales = field(default_factory=LossScales)
    free_nats: float = _f(1.0, ">= 0")
    """each step's KL is clipped below at this (no gradient under it)"""
    slowreg: float = _f(1.0, ">= 0")
    """pull of both critic terms towards the slow critic's values"""
    max_skips: int = _f(10, ">= 0")
    """NaN/Inf updates in a row before the run stops (with a checkpoint)"""
    slow_critic: float = _f(0.02, "(0, 1]")
    """the slow critic's step towards the critic per update (an EMA rate)"""
    dist_timeout: float = _f(600.0, "> 0")
    """seconds a rank waits in a collective before it fails (data-parallel runs)"""


@dataclass
class EvalConfig:
    """Evaluation during training and by ``python -m dreamer.evaluate``."""

    every: int = _f(50_000, ">= 0")
    """env steps between evaluations during training; 0 = none"""
    envs: int = _f(1, ">= 1")
    """eval envs, stepped together in one process of their own"""
    episodes: int = _f(10, ">= 1")
    """episodes per evaluation"""
    max_steps: int = _f(0, ">= 0")
    """per-episode cap (a truncation); 0 = the env's own"""
    render_workers: int | None = _f(None, ">= 0")
    """processes drawing the reports; none = min(usable cores, 16); 0 = inline"""
    checkpoint: str | None = _f(None)
    """dreamer.evaluate: the checkpoint file; none = the run's latest"""
    timeout: float = _f(600.0, "> 0")
    """seconds the end of a run waits for a pending evaluation"""


@dataclass
class MlflowConfig:
    uri: str | None = _f(None)
    """tracking server: http://host:port; none = a file store in <run.logdir>/mlflow"""
    experiment: str = _f("dreamer")
    """MLflow experiment name"""


@dataclass
class WandbConfig:
    project: str = _f("dreamer")
    """W&B project"""
    entity: str | None = _f(None)
    """W&B entity (user or team); none = the key's default"""
    mode: str = _f("auto", choices=("auto", "online", "offline"))
    """auto = online with an API key, offline without"""


@dataclass
class LoggerConfig:
    use: list[str] = _list(["jsonl", "tensorboard"])
    """outputs besides metrics.jsonl (always written): any of tensorboard, mlflow,
    wandb; logger=[...] sets this"""
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class Config:
    env: EnvSettings = field(default_factory=EnvSettings)  # a kind's own: dreamer/envs/
    model: ModelConfig = field(default_factory=ModelConfig)
    run: RunConfig = field(default_factory=RunConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def _env_keys(env_name: str | None) -> dict[str, Any]:
    """The ``env.*`` keys and their types: of ``env=<env_name>``, or of every env kind
    (before composition, when the kind is not known yet)."""
    names = [env_name] if env_name else list(registry.KINDS)
    keys: dict[str, Any] = {}
    for name in names:
        for key, kind in typing.get_type_hints(registry.settings(name)).items():
            keys.setdefault(key, kind)
    return keys


# Keys an earlier version had: set on a command line or in a preset, one line saying
# what replaced them; in a run directory's saved config, dropped (the run resumes).
REMOVED_KEYS = {
    "learner.rollout": "removed: the update is one implementation on every device; "
    "learner.compile and learner.precision choose how it runs",
}


def without_removed(saved: dict) -> dict:
    """A saved config (a nested dict) without the ``REMOVED_KEYS``."""
    saved = copy.deepcopy(saved)
    for key in REMOVED_KEYS:
        section, _, name = key.rpartition(".")
        node = saved
        for part in section.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(name, None)
    return saved


def _schema_type(key: str, env_name: str | None = None) -> Any:
    """The schema type at dotted ``key`` (a dataclass for a section); ConfigError if unknown.
    ``env.*`` keys are the env kind's (``env_name``), or any kind's when it is None."""
    if key in REMOVED_KEYS:
        raise ConfigError(f"{key}: {REMOVED_KEYS[key]}")
    section, _, rest = key.partition(".")
    if section == "env" and rest:
        keys = _env_keys(env_name)
        name = rest.split(".")[0]
        if name not in keys:
            where = f"under env (env={env_name})" if env_name else "under env"
            allowed = ", ".join(sorted(keys))
            raise ConfigError(f"{key}: unknown key; allowed keys {where}: {allowed}")
        if "." in rest:
            raise ConfigError(f"{key}: unknown key; env.{name} is a value, not a section")
        return keys[name]
    node: Any = Config
    for i, part in enumerate(key.split(".")):
        parent = ".".join(key.split(".")[:i])
        if not dataclasses.is_dataclass(node):
            raise ConfigError(f"{key}: unknown key; {parent} is a value, not a section")
        hints = typing.get_type_hints(node)
        if part not in hints:
            where = f"under {parent}" if parent else "at the top level"
            raise ConfigError(
                f"{key}: unknown key; allowed keys {where}: {', '.join(sorted(hints))}"
            )
        node = hints[part]
    return node


def options(group: str) -> list[str]:
    """The option names of a config group, in natural order (size1m before size12m)."""
    names = [p.stem for p in (CONF_DIR / group).glob("*.yaml")]
    return sorted(
        names, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]
    )


def _check_overrides(overrides: list[str]) -> list[str]:
    """Reject what Hydra would accept silently (``+new.key=1``) or explain badly.

    Returns the overrides to hand to Hydra (``experiment=null`` dropped: it is the default,
    and Hydra's compose rejects a null group override with a bare ValueError).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, kept = OverridesParser.create(), []
    for text in overrides:
        if text.startswith("logger="):  # the documented shorthand for logger.use=[...]
            text = "logger.use=" + text.split("=", 1)[1]
        key, _, raw = text.lstrip("+~").partition("=")
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
                raise ConfigError(f"{key}: unknown option {value!r}; allowed: {allowed}")
        else:
            _schema_type(key)
        if ov.is_add():  # every schema key and group already exists; '+' only errors in Hydra
            raise ConfigError(f"{key}: already defined; drop the '+' ({text.lstrip('+')})")
        kept.append(text)
    return kept


DICT_KEYS = ("env.kwargs",)


def _parsed(override: str) -> tuple[str, Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (parsed,) = OverridesParser.create().parse_overrides([override])
    return parsed.key_or_group, parsed.value()


def _wrong_type(key: str, value: Any, env_name: str | None = None) -> ConfigError:
    kind = _schema_type(key, env_name)
    kind = next((t for t in typing.get_args(kind) if t is not type(None)), kind)  # Optional
    return ConfigError(f"{key}: expected {_KINDS.get(kind, 'another type')}, got {value!r}")


def _composition_error(e: Exception, env_name: str | None = None) -> ConfigError:
    """Turn a Hydra/OmegaConf exception into a one-line ConfigError."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause: BaseException | None = e  # the innermost OmegaConf error names the dotted key
    while cause is not None and not getattr(cause, "full_key", None):
        cause = cause.__cause__ or cause.__context__
    key = getattr(cause, "full_key", None)
    if not key:
        return ConfigError(str(e).strip().splitlines()[0])
    if isinstance(cause, ConfigAttributeError | ConfigKeyError):  # e.g. stray key in a preset
        _schema_type(key, env_name)  # raises the usual "unknown key; allowed keys ..." error
    if isinstance(cause, ValidationError):
        return _wrong_type(key, cause.value, env_name)
    return ConfigError(f"{key}: {str(cause).splitlines()[0]}")


# --------------------------------------------------------------------------- validation


def check_value(override: str) -> tuple[str, Any]:
    """One ``section.key=value`` parsed, typed and range-checked against the schema alone
    (``dreamer.evaluate`` reads everything else from the run directory)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException
    from omegaconf.errors import ValidationError

    key, sep, raw = override.partition("=")
    if "." not in key or not sep:
        raise ConfigError(f"{override}: expected section.key=value")
    _schema_type(key)
    section, name = key.split(".", 1)
    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
        node = OmegaConf.structured(typing.get_type_hints(Config)[section])
        node[name] = parsed.value()
    except OverrideParseException:
        raise ConfigError(f"{key}: bad value {raw!r}") from None
    except ValidationError:
        raise _wrong_type(key, raw) from None
    field_ = next(
        f for f in dataclasses.fields(typing.get_type_hints(Config)[section]) if f.name == name
    )
    check_field(key, node[name], field_.metadata)
    return key, node[name]


def _check_world(cfg: DictConfig, ranks: int) -> None:
    """``run.envs`` and ``replay.batch`` are the whole job's; each of ``ranks`` ranks
    takes an equal share."""
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


# --------------------------------------------------------------------------- public API


def register_schema() -> None:
    """Register the schema with Hydra's ConfigStore as ``dreamer_schema`` (idempotent):
    every section typed but ``env``, which its kind types once composed (``finish``)."""
    from hydra.core.config_store import ConfigStore

    sections = typing.get_type_hints(Config)
    node = OmegaConf.create(
        {name: OmegaConf.structured(cls) for name, cls in sections.items() if name != "env"}
    )
    node.env = {}
    OmegaConf.set_struct(node.env, False)  # an override of another kind's key reaches finish
    ConfigStore.instance().store(name="dreamer_schema", node=node)


def runs_folder(env) -> Path:
    """Where an env's runs go without ``run.logdir``: ``runs/<env.name>/``, and for a
    gymnasium env ``runs/gym/<env.id>/`` (``/`` and ``:`` of the id as ``_``): the folder
    names the env, as the run's lines do."""
    if env.name == "gym":
        return Path("runs") / "gym" / re.sub(r"[/:\\]", "_", str(env.id))
    return Path("runs") / env.name


def resolved_logdir(cfg: DictConfig) -> Path:
    """``run.logdir`` if set (with ``run.resume=latest``: one holding a checkpoint), else
    with ``run.resume=latest`` the newest unfinished run of this env (``runs_folder``),
    else a new ``<runs_folder>/<YYYYmmdd-HHMMSS>``."""
    from dreamer.runtime import checkpoint

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


def run_folders(env) -> list[Path]:
    """The run directories of this env: those in its ``runs_folder``, and for a gym env
    those a run before 2026-12-06 wrote to ``runs/gym/<YYYYmmdd-HHMMSS>/`` with this id
    (its ``config.yaml`` says which)."""
    folders = [p for p in runs_folder(env).glob("*") if p.is_dir()]
    if env.name == "gym":
        for folder in Path("runs/gym").glob("*"):
            saved = folder / "config.yaml"
            if saved.is_file() and OmegaConf.load(saved).get("env", {}).get("id") == env.id:
                folders.append(folder)
    return folders


def latest_unfinished(folders: list[Path], steps: int) -> Path | None:
    """The newest of the run directories ``folders`` whose latest checkpoint (its name
    holds its env step) is short of ``steps``."""
    from dreamer.runtime import checkpoint

    for folder in sorted(folders, key=lambda p: p.name, reverse=True):  # <YYYYmmdd-HHMMSS>
        saved = checkpoint.saved_steps(folder)
        if saved and saved[-1] < steps:
            return folder
    return None


def load(overrides: list[str]) -> DictConfig:
    """Compose conf/config.yaml with Hydra-style ``overrides``, validate, derive, freeze.

    The world size (``WORLD_SIZE`` from torchrun) takes part in validation. What the
    machine must offer (CUDA, an env's or tracker's package) is checked where it is
    needed: ``World.device``, ``learner_modes``, ``collect.check_machine``, ``check_env``,
    ``start_trackers``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = _check_overrides(list(overrides))
    # Hydra merges a dict override into the existing (struct) dict and refuses new keys:
    # a dict-valued key (env.kwargs) is set after composition instead, replacing it whole.
    dict_values = {}
    for text in [t for t in overrides if t.partition("=")[0] in DICT_KEYS]:
        overrides.remove(text)
        key, value = _parsed(text)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, e.g. {key}={{max_episode_steps: 100}}")
        dict_values[key] = value
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base=None, config_dir=str(CONF_DIR)):
            composed = compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise _composition_error(e) from None
    finally:
        GlobalHydra.instance().clear()
    return finish(composed, dict_values)


def finish(composed: DictConfig, dict_values: Mapping[str, Any] = {}) -> DictConfig:  # noqa: B006
    """A config Hydra composed (by ``load``, or by ``-m``'s launcher for a sweep job) as
    the run's config: exactly the schema's sections, ``dict_values`` set whole,
    validated, derived (``run.logdir``) and frozen."""
    from omegaconf.errors import OmegaConfBaseException

    sections = list(typing.get_type_hints(Config))
    env_name = OmegaConf.select(composed, "env.name")
    try:
        cfg = OmegaConf.merge(schema(env_name), OmegaConf.masked_copy(composed, sections))
        for key, value in dict_values.items():
            OmegaConf.update(cfg, key, value, merge=False)
    except OmegaConfBaseException as e:
        raise _composition_error(e, env_name) from None
    from dreamer.runtime.dist import World

    _validate(cfg, World.from_environment().size)
    cfg.run.logdir = str(resolved_logdir(cfg))
    OmegaConf.set_struct(cfg, True)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def schema(env_name: str) -> DictConfig:
    """The structured config of a run on ``env=<env_name>``: every section's dataclass,
    the env section that kind's settings (``dreamer/envs/registry.py``)."""
    node = OmegaConf.structured(Config)
    node.env = OmegaConf.structured(registry.settings(env_name))
    return node


def saved(path: Path) -> DictConfig:
    """A run directory's ``config.yaml`` typed by the schema (``dreamer.evaluate``); one
    that does not fit it (another version's keys) is a ``ConfigError`` naming the key."""
    from omegaconf.errors import OmegaConfBaseException

    stored = OmegaConf.create(without_removed(OmegaConf.to_container(OmegaConf.load(path))))
    env_name = OmegaConf.select(stored, "env.name")
    try:
        try:
            return OmegaConf.merge(schema(env_name), stored)
        except OmegaConfBaseException as e:
            raise _composition_error(e, env_name) from None
    except ConfigError as error:
        raise ConfigError(f"{path}: not a config this dreamer reads ({error})") from None


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


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as one level of dotted keys: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    if isinstance(node, dict):
        items: dict[str, Any] = {}
        for key, value in node.items():
            items.update(flatten(value, f"{prefix}{key}."))
        return items
    return {prefix[:-1]: node}


def check_resume(saved: dict, cfg: DictConfig) -> None:
    """Refuse to resume a run directory under a config that differs outside
    ``RESUMABLE_KEYS``; the message names the first differing key."""
    before = flatten(without_removed(saved))
    after = flatten(OmegaConf.to_container(cfg))
    for key in sorted(set(before) | set(after)):
        if key in RESUMABLE_KEYS or before.get(key) == after.get(key):
            continue
        raise ConfigError(
            f"{key}: cannot change on resume ({before.get(key)!r} -> {after.get(key)!r}); "
            f"allowed to change: {', '.join(RESUMABLE_KEYS)}"
        )


def group_defaults(group: str, option: str) -> DictConfig:
    """What ``<group>=<option>`` (``env`` or ``model``) makes its section before an
    experiment preset or an override: the option's YAML over the section's schema (for
    ``env``, its kind's settings), as ``load`` composes and ``finish`` types it."""
    preset = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
    cls = registry.settings(preset.name) if group == "env" else typing.get_type_hints(Config)[group]
    return OmegaConf.merge(OmegaConf.structured(cls), preset)


def parse_args(
    argv: list[str],
    usage_text: str,
    allowed: tuple[str, ...] | None = None,
    positional: str | None = None,
    cfg_flag: bool = False,
) -> tuple[list[str], str | None]:
    """The one command-line parser of train, evaluate and export: ``key=value``
    overrides (of ``allowed`` keys only, when given; a bare word is ``positional=word``),
    ``-h``/``--help`` (prints ``usage_text``, exits 0) and, with ``cfg_flag``, ``--cfg
    job``. Returns (overrides, the --cfg value or None); a bad one is a ``ConfigError``."""
    overrides, show = [], None
    flags = "--cfg job, -h/--help" if cfg_flag else "-h/--help"
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            print(usage_text)
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
