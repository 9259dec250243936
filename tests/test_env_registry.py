"""The env kinds: one table (``dreamer/envs/registry.py``), one module and one YAML each,
and no check on an env's name anywhere else in the package."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import dreamer
from dreamer.config import CONF_DIR
from dreamer.envs import registry
from dreamer.envs.settings import EnvSettings

PACKAGE = Path(dreamer.__file__).parent


def test_every_kind_has_a_yaml_a_settings_class_and_a_maker_and_nothing_else_does():
    yamls = {path.stem: OmegaConf.load(path) for path in (CONF_DIR / "env").glob("*.yaml")}
    assert set(yamls) == set(registry.KINDS)
    for name, preset in yamls.items():
        assert preset.name == name
        kind = registry.kind(name)
        assert issubclass(kind.settings, EnvSettings) and callable(kind.adapter.make)
        keys = {item.name for item in dataclasses.fields(kind.settings)}
        values = set(preset) - {"defaults"}  # Hydra's list: the kind's schema, then these
        assert values <= keys, f"conf/env/{name}.yaml: {values - keys}"


def test_no_module_outside_envs_compares_with_an_env_kind_name():
    """``env.name == "crafter"`` or ``in ("atari", ...)`` outside dreamer/envs/ is what the
    registry's rows replace."""
    names = set(registry.KINDS)
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "envs" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for side in [node.left, *node.comparators]:
                for constant in ast.walk(side):
                    if isinstance(constant, ast.Constant) and constant.value in names:
                        found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, found


def test_a_saved_config_with_another_kinds_env_key_is_one_line(tmp_path):
    """A run directory's config.yaml from before the registry (every env's keys under
    env) is refused in one line naming the file and the key, not a traceback."""
    from dreamer.command_line import load
    from dreamer.errors import ConfigError
    from dreamer.training.resume import saved

    stored = OmegaConf.to_container(load(["experiment=smoke"]))
    OmegaConf.save(stored, tmp_path / "config.yaml")
    assert saved(tmp_path / "config.yaml").env == stored["env"]
    stored["env"]["cues"] = 4  # a cue key on crafter
    OmegaConf.save(stored, tmp_path / "config.yaml")
    with pytest.raises(ConfigError) as raised:
        saved(tmp_path / "config.yaml")
    message = str(raised.value)
    assert "config.yaml" in message and "env.cues: unknown key" in message
    assert "\n" not in message


def test_make_reads_its_kinds_row_once_per_env_it_builds():
    """The env set-up walks one way: each function of envs/make.py asks the registry for
    the kind's row at most once and reads the rest from it (following cfg there visited
    make.py and registry.py seven times each, alternating)."""
    tree = ast.parse((PACKAGE / "envs" / "make.py").read_text())
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        asked = [
            node.func.attr
            for node in ast.walk(function)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "registry"
            and node.func.attr != "label"  # how lines name it, not what it is
        ]
        assert len(asked) <= 1, (function.name, asked)
