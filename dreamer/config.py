"""The schema: every configuration key, its type, range or choices and its meaning (the
string under each field), as dataclasses per section; each env kind's ``env.*`` keys are
its own (``dreamer/envs/``). The YAML presets live in ``conf/``.

``dreamer/command_line.py`` composes a run's config against it (``load``);
``dreamer/training/resume.py`` decides where a run writes and what a resume may change.
Loading a config reads no run directory."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dreamer.envs import registry
from dreamer.envs.settings import EnvSettings
from dreamer.errors import ConfigError, did_you_mean
from dreamer.schema import TRISTATE, installed, pip_install
from dreamer.schema import f as _f
from dreamer.schema import section as _section
from dreamer.schema import strings as _list

# the YAML presets: conf/ at the top of a checkout, the package dreamer.conf in a wheel
_HERE = Path(__file__).resolve().parent
CONF_DIR = _HERE / "conf" if (_HERE / "conf").is_dir() else _HERE.parent / "conf"
GROUPS = ("env", "model", "experiment")  # config groups: directories under conf/


WARM_START_PARTS = ("world_model", "actor", "critic", "optimizer")
LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow")
TRACKER_EXTRAS = ("mlflow", "wandb")  # loggers whose package is an extra of that name


def check_trackers(names) -> None:
    """``ConfigError`` for a tracker in ``names`` (``logger.use``) whose extra is missing;
    before torch loads: the refusal comes at once."""
    for name in sorted(set(names) & set(TRACKER_EXTRAS)):
        if not installed(name):
            raise ConfigError(
                f"logger: {name} is not installed; install it with {pip_install(name)}"
            )


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

    steps: int = _f(1_000_000, ">= 1", resumable=True)
    """env steps in total"""
    envs: int = _f(4, ">= 1")
    """env workers (the whole job's: split across ranks)"""
    train_ratio: float = _f(512.0, "> 0")
    """replayed steps per env step: updates per env step = train_ratio / (replay.batch x
    replay.length)"""
    train_starts: int = _f(1024, ">= 0")
    """env steps collected before the first update (the official DreamerV3 starts at one
    batch of steps: replay.batch x replay.length, 16 x 64 in its presets)"""
    seed: int = _f(0)
    """seed of the weights, the env workers and the replay sampling"""
    logdir: str | None = _f(None, resumable=True)
    """where the run writes; none = runs/<env.name>/<YYYYmmdd-HHMMSS> (env=gym:
    runs/gym/<env.id>/<YYYYmmdd-HHMMSS>)"""
    resume: str = _f("never", choices=("never", "latest"), resumable=True)
    """latest: without run.logdir, continue the newest run of this env (under
    runs/<env.name>/; make resume) short of its own run.steps, with its own config and
    what the command line sets on top, instead of starting a new one"""
    log_every: int = _f(1000, ">= 1", resumable=True)
    """env steps between metrics rows"""
    log_seconds: float = _f(300.0, "> 0", resumable=True)
    """wall seconds a metrics row waits at most (when new env steps came), whatever
    log_every"""
    save_every: float = _f(900.0, "> 0", resumable=True)
    """seconds between checkpoints"""
    keep: int = _f(3, ">= 1", resumable=True)
    """checkpoints kept"""
    save_failures: int = _f(3, ">= 1", resumable=True)
    """checkpoint writes failing in a row (a full disk, a quota) before the run stops
    with exit 1; the last good checkpoint stays the one a rerun resumes from"""
    progress: bool = _f(True, resumable=True)
    """the progress bar (env steps, updates, ETA) on stderr"""
    gc_freeze: bool = _f(True, resumable=True)
    """gc.freeze() the set-up's heap for the loop (false: to measure what it saves)"""
    from_checkpoint: str | None = _f(None, resumable=True)
    """a new run starts from the weights of this run directory (its latest checkpoint)
    or checkpoint file"""
    from_checkpoint_parts: list[str] = _list(["world_model", "actor", "critic"], resumable=True)
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
    sync_every: int = _f(10, ">= 1", resumable=True)
    """learner updates between weight pushes to the inference process"""
    push_timeout: float = _f(5.0, "> 0", resumable=True)
    """seconds a weight push waits for the inference process; a starved one (logged)
    gets the next push"""
    threads: int = _f(1, ">= 1", resumable=True)
    """torch threads of the inference process"""
    envs_per_worker: int = _f(1, ">= 1", resumable=True)
    """envs per worker process (must divide run.envs); > 1: torchrl serves the policy
    from a driver thread and does not chunk"""
    worker_affinity: str = _f("none", choices=("none", "spread"), resumable=True)
    """spread: env worker i pinned to the i-th allowed core (Linux)"""
    pace: str = _f("auto", choices=("auto", "stop", "nice", "pause", "none"), resumable=True)
    """collection while the learner updates: stop = env workers and inference stopped
    (SIGSTOP) through each update burst, nice = at the lowest CPU priority, pause =
    parked by torchrl (waking every 10 ms), none = running beside it; auto = stop with a
    CPU learner on 4 usable cores or fewer, else none (a GPU learner: collection overlaps)"""
    inference: InferenceConfig = _section(InferenceConfig, resumable=True)


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

    device: str = _f("auto", choices=("auto", "cpu", "cuda"), resumable=True)
    """where the learner runs; auto = cuda when a GPU is visible"""
    precision: str = _f("auto", choices=("auto", "bf16", "fp32"), resumable=True)
    """bf16 = the loss under bf16 autocast, without loss scaling (CUDA, or a CPU with
    bf16 instructions); auto = bf16 on CUDA, fp32 on the CPU"""
    compile: str = _f("auto", choices=TRISTATE, resumable=True)
    """torch.compile the update's step functions (RSSM steps, the losses after
    imagination), cached under $XDG_CACHE_HOME/dreamer; auto = on CUDA (the long CPU
    presets set true)"""
    cudagraph: str = _f("auto", choices=TRISTATE, resumable=True)
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
    threads: int = _f(0, ">= 0", resumable=True)
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
    slow_critic_rate: float = _f(0.02, "(0, 1]")
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
    use: list[str] = _list(["jsonl", "tensorboard"], resumable=True)
    """outputs besides metrics.jsonl (always written): any of tensorboard, mlflow,
    wandb; logger=[...] sets this"""
    mlflow: MlflowConfig = _section(MlflowConfig, resumable=True)
    wandb: WandbConfig = _section(WandbConfig, resumable=True)


@dataclass
class Config:
    env: EnvSettings = field(default_factory=EnvSettings)  # a kind's own: dreamer/envs/
    model: ModelConfig = field(default_factory=ModelConfig)
    run: RunConfig = field(default_factory=RunConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    eval: EvalConfig = _section(EvalConfig, resumable=True)
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


# Keys renamed since: on a command line the old name still works, with a line naming
# the new one; a run directory's saved config is read under the new name.
RENAMED_KEYS = {
    "learner.slow_critic": "learner.slow_critic_rate",  # an EMA rate, beside slowreg's weight
}


def in_current_keys(saved: dict) -> dict:
    """A saved config (a nested dict) in today's keys: ``REMOVED_KEYS`` dropped,
    ``RENAMED_KEYS`` under their new names."""
    saved = copy.deepcopy(saved)

    def section_of(key: str) -> tuple[dict, str]:
        section, _, name = key.rpartition(".")
        node = saved
        for part in section.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return (node if isinstance(node, dict) else {}), name

    for key in REMOVED_KEYS:
        node, name = section_of(key)
        node.pop(name, None)
    for old, new in RENAMED_KEYS.items():
        node, name = section_of(old)
        if name in node:
            node[new.rpartition(".")[2]] = node.pop(name)
    return saved


def schema_type(key: str, env_name: str | None = None) -> Any:
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
            hint = did_you_mean(name, keys, "env.{}")
            raise ConfigError(f"{key}: unknown key{hint}; allowed keys {where}: {allowed}")
        if "." in rest:
            raise ConfigError(f"{key}: unknown key; env.{name} is a value, not a section")
        return keys[name]
    node: Any = Config
    for i, part in enumerate(key.split(".")):
        parent = ".".join(key.split(".")[:i])
        if not dataclasses.is_dataclass(node):
            raise ConfigError(f"{key}: unknown key; {parent} is a value, not a section")
        hints = typing.get_type_hints(node)
        if part not in hints and not parent:  # a group's name too: experiment=smoke
            rest = key[len(part) :].replace("{", "{{").replace("}", "}}")
            hint = did_you_mean(part, GROUPS, "{}=<option>") or did_you_mean(
                part, hints, "{}" + rest
            )
            raise ConfigError(
                f"{key}: unknown key{hint}; allowed at the top level: the groups "
                f"{', '.join(GROUPS)} (group=<option>) and the sections {', '.join(sorted(hints))}"
            )
        if part not in hints:
            raise ConfigError(
                f"{key}: unknown key{did_you_mean(part, hints, f'{parent}.{{}}')}; allowed "
                f"keys under {parent}: {', '.join(sorted(hints))}"
            )
        node = hints[part]
    return node


def options(group: str) -> list[str]:
    """The option names of a config group, in natural order (size1m before size12m)."""
    names = [p.stem for p in (CONF_DIR / group).glob("*.yaml")]
    return sorted(
        names, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]
    )


@functools.cache  # once per process: storing it again cost ~0.08 s of every load
def register_schema() -> None:
    """Register the schema with Hydra's ConfigStore, as Hydra types a config
    group: ``dreamer_schema``, every section (``env``: the keys every kind has), and
    ``env/<kind>_schema``, a kind's own keys, which ``conf/env/<kind>.yaml`` names first
    in its defaults list: Hydra composes each section typed."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="dreamer_schema", node=Config)
    for name in registry.KINDS:
        store.store(group="env", name=f"{name}_schema", node=registry.settings(name))


def schema(env_name: str) -> DictConfig:
    """The structured config of a run on ``env=<env_name>``: every section's dataclass,
    the env section that kind's settings (``dreamer/envs/registry.py``)."""
    node = OmegaConf.structured(Config)
    node.env = OmegaConf.structured(registry.settings(env_name))
    return node


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as one level of dotted keys: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    if isinstance(node, dict):
        items: dict[str, Any] = {}
        for key, value in node.items():
            items.update(flatten(value, f"{prefix}{key}."))
        return items
    return {prefix[:-1]: node}


def group_defaults(group: str, option: str) -> DictConfig:
    """What ``<group>=<option>`` (``env`` or ``model``) makes its section before an
    experiment preset or an override: the option's YAML over the section's schema (for
    ``env``, its kind's settings), as ``load`` composes and ``finish`` types it."""
    preset = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
    preset.pop("defaults", None)  # an env option's: its kind's schema, the cls below
    cls = registry.settings(preset.name) if group == "env" else typing.get_type_hints(Config)[group]
    return OmegaConf.merge(OmegaConf.structured(cls), preset)


def resumable_keys(node: type = Config, prefix: str = "", marked: bool = False) -> tuple[str, ...]:
    """The keys a resumed run may set anew, in schema order: the fields marked
    ``resumable``, and every key of a section so marked; every other key is its run's."""
    keys: list[str] = []
    hints = typing.get_type_hints(node)
    for item in dataclasses.fields(node):
        chosen = marked or item.metadata.get("resumable", False)
        if dataclasses.is_dataclass(hints[item.name]):
            keys += resumable_keys(hints[item.name], f"{prefix}{item.name}.", chosen)
        elif chosen:
            keys.append(f"{prefix}{item.name}")
    return tuple(keys)
