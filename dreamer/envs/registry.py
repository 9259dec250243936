"""Every env kind in one table: ``env=<name>`` (``conf/env/<name>.yaml``) picks a row.

A kind's ``env.*`` keys are a dataclass in ``dreamer/envs/settings.py`` (read without
the env's packages); its module holds ``make(env, seed)`` (also to recreate a failed
env) and optionally ``check(env)`` (what the machine must offer: one ``ConfigError``
line) and ``ACHIEVEMENTS``. Adding an env: one module, its keys, one row, one YAML."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
from dataclasses import dataclass
from types import ModuleType

from dreamer.envs import settings as keys
from dreamer.errors import ConfigError
from dreamer.schema import installed, pip_install

# set by make's train, smoke and resume: the extra a chosen env needs is installed first
INSTALL_EXTRAS = "DREAMER_INSTALL_EXTRAS"
DISTRIBUTION = "dreamer-torchrl"  # pyproject.toml's name (PyPI's "dreamer" is another)


@dataclass(frozen=True)
class EnvKind:
    module: str  # dreamer.envs.<module>
    settings: type  # its env.* keys: a dataclass over EnvSettings (dreamer/envs/settings.py)
    package: str | None = None  # the import its extra provides
    # what its envs import, preloaded by the env workers' forkserver so they share it
    preload: str | None = None
    extra: str = ""  # the project's extra that installs that package
    install_note: str = ""  # what else it needs
    caps_episodes: bool = False  # env.length ends episodes here; the others end their own
    # its make takes the seed; a seeding reset would redo it (a Crafter world, a Java launch)
    seeded_by_make: bool = False
    launch_lock: bool = False  # its launches share a lock file in the run directory
    label: str = "name"  # the key that names the configured env in lines

    @property
    def adapter(self) -> ModuleType:
        return importlib.import_module(self.module)

    @property
    def achievements(self) -> tuple[str, ...]:
        return tuple(getattr(self.adapter, "ACHIEVEMENTS", ()))

    def check(self, env) -> None:
        """What the machine must offer for ``env``: this kind's package (else a
        ``ConfigError`` with the install command) and what the module's ``check`` asks."""
        if self.package and not installed(self.package):
            raise ConfigError(
                f"env: {env['name']} needs {self.package}; install it with "
                f"{pip_install(self.extra)}{self.install_note}"
            )
        if hasattr(self.adapter, "check"):
            self.adapter.check(env)

    def install_extra(self, env) -> None:
        """Where ``DREAMER_INSTALL_EXTRAS`` is set, pip-install a missing package's extra
        into this interpreter; one that needs more than pip is left to ``check``'s line."""
        if not os.environ.get(INSTALL_EXTRAS) or not self.package or self.install_note:
            return
        if installed(self.package):
            return
        marker = f'extra == "{self.extra}"'
        try:
            needs = [
                r.split(";")[0] for r in importlib.metadata.requires(DISTRIBUTION) if marker in r
            ]
        except importlib.metadata.PackageNotFoundError:  # a source tree, not installed
            return
        command = [sys.executable, "-m", "pip", "install", "--quiet", *needs]
        print(f"env: {env['name']} needs {self.package}: installing {' '.join(needs)}", flush=True)
        if subprocess.run(command).returncode != 0:
            raise ConfigError(f"env: {env['name']}: installing {' '.join(needs)} failed (above)")
        importlib.invalidate_caches()


KINDS = {
    "crafter": EnvKind("dreamer.envs.crafter", keys.CrafterSettings, seeded_by_make=True),
    "cue": EnvKind("dreamer.envs.cue", keys.CueSettings),
    "cartpole": EnvKind("dreamer.envs.gymnasium_ids", keys.GymSettings, caps_episodes=True),
    "gym": EnvKind("dreamer.envs.gymnasium_ids", keys.GymSettings, caps_episodes=True, label="id"),
    "dmc": EnvKind(
        "dreamer.envs.dmc",
        keys.DmcSettings,
        package="dm_control",
        preload="dm_control.suite",
        extra="dmc",
        caps_episodes=True,
    ),
    "atari": EnvKind(
        "dreamer.envs.atari",
        keys.AtariSettings,
        package="ale_py",
        preload="PIL.Image",  # the frames' resize (dreamer.envs.wrappers)
        extra="atari",
        caps_episodes=True,
    ),
    "minedojo": EnvKind(
        "dreamer.envs.minedojo",
        keys.MinedojoSettings,
        package="minedojo",
        extra="minedojo",
        install_note=(
            ' (MineDojo also needs gym 0.21, numpy<2, JDK 8 and xvfb: docs/envs.md, "MineDojo")'
        ),
        seeded_by_make=True,
        launch_lock=True,
    ),
}


def kind(name: str) -> EnvKind:
    if name not in KINDS:
        raise ConfigError(f"env.name: unknown env {name!r}; allowed: {', '.join(KINDS)}")
    return KINDS[name]


def settings(name: str) -> type:
    return kind(name).settings


def label(env) -> str:
    """How lines name the configured env: its gymnasium id for ``env=gym``."""
    return env[kind(env["name"]).label]
