"""One source for every default: an env kind's keys get theirs from its ``Settings``
(``dreamer/envs/<kind>.py``) alone, and ``--help`` prints the values a run of each group
option gets, as ``--cfg job`` resolves them."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
import yaml
from omegaconf import MISSING, OmegaConf

from dreamer import config
from dreamer.config import CONF_DIR
from dreamer.envs import registry
from dreamer.key_reference import shown
from dreamer.train import from_argv


def shown_as(value) -> str:
    """A resolved value as --help writes it (true, none, [a,b])."""
    return shown(value, "")


ENV_PRESETS = sorted((CONF_DIR / "env").glob("*.yaml"))
# key=value with a list or mapping value (spaces inside), key=value, or a bare key
TOKEN = re.compile(r"(\w+)(?:=(\[[^\]]*\]|\{[^}]*\}|\S+))?")
DERIVED = {"run.logdir"}  # None in the schema: the run derives runs/<env>/<timestamp>


def printed(capsys, *argv: str) -> str:
    """What ``python -m dreamer.train ARGV`` prints before it exits 0 (the same parser)."""
    with pytest.raises(SystemExit) as exited:
        from_argv(list(argv))
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    return out


def help_lines(capsys) -> dict[str, dict[str, str | None]]:
    """``--help``'s values: {label: {key: the printed value, or None for a required key}}
    for each ``env=<option>`` and ``model=<option>`` and each other section (keys
    without their section's prefix)."""
    lines: dict[str, dict[str, str | None]] = {}
    text = re.sub(r"\n    (?=\S)", " ", printed(capsys, "--help"))  # a preset line goes on
    label = None
    for line in text.splitlines():
        if header := re.match(r"([\w.=]+):(?: |$)", line):
            label = header[1] if header[1] not in ("usage", "model") else None
            if label:
                lines[label] = {}
        elif preset := re.fullmatch(r"  (model=\w+): (.*)", line):
            lines[preset[1]] = dict(TOKEN.findall(preset[2]))
        elif label and (key := re.match(r"  ([\w.]+)=(\S*)", line)):
            prefix = "env." if label.startswith("env=") else f"{label}."
            name = key[1].removeprefix(prefix)
            lines[label][name] = None if key[2] == "required" else key[2]
    return lines


def resolved(capsys, *overrides: str) -> dict:
    return yaml.safe_load(printed(capsys, *overrides, "--cfg", "job"))


@pytest.mark.parametrize("path", ENV_PRESETS, ids=lambda p: p.stem)
def test_an_env_preset_sets_only_what_its_kinds_schema_leaves_unset(path):
    """A value both in ``conf/env/<kind>.yaml`` and in the kind's ``Settings`` is two
    sources that can disagree (atari's YAML said 96 x 96 gray frames, its schema 64 RGB,
    and ``--help`` printed the schema's): the YAML names the kind and fills only keys
    without a schema default."""
    preset = OmegaConf.load(path)
    # Hydra's schema of a group option: the kind's settings, registered by the trainer
    assert list(preset.pop("defaults")) == [f"{path.stem}_schema", "_self_"]
    fields = {item.name: item for item in dataclasses.fields(registry.settings(preset.name))}
    required = {
        name
        for name, item in fields.items()
        if item.default is MISSING or item.default == MISSING  # omegaconf's "???"
    }
    restated = {key: preset[key] for key in preset if key not in required}
    assert not restated, f"{path.name} restates schema defaults: {restated}"


@pytest.mark.parametrize("group", ["env", "model"])
def test_help_prints_what_a_run_of_each_option_gets(group, capsys):
    """For every option of the group and every key of its section, ``--help``'s value is
    ``--cfg job``'s with ``<group>=<option>``; a key printed bare has no value until set
    (``env=gym``'s ``id``): ``--cfg job`` needs it."""
    lines = help_lines(capsys)
    options = config.options(group)
    assert {label for label in lines if label.startswith(f"{group}=")} == {
        f"{group}={option}" for option in options
    }
    for option in options:
        shown = lines[f"{group}={option}"]
        bare = [key for key, value in shown.items() if value is None]
        for key in bare:  # without it the run refuses to start
            with pytest.raises(SystemExit) as exited:
                from_argv([f"{group}={option}", "--cfg", "job"])
            assert exited.value.code == 2
            assert f"{group}.{key}" in capsys.readouterr().err
        filled = [f"{group}.{key}=Set-v0" for key in bare]
        section = resolved(capsys, f"{group}={option}", *filled)[group]
        assert set(shown) == set(section) - {"name"}, option
        for key, value in shown.items():
            if value is not None:
                assert value == shown_as(section[key]), f"{group}={option}: {key}"


def test_help_prints_the_other_sections_as_a_run_without_overrides_gets_them(capsys):
    lines = help_lines(capsys)
    run = resolved(capsys)
    sections = [label for label in lines if "=" not in label]
    assert "run" in sections and "collector.inference" in sections
    for label in sections:
        node = run
        for part in label.split("."):
            node = node[part]
        leaves = {key for key, value in node.items() if not isinstance(value, dict)}
        assert set(lines[label]) == leaves, label
        for key, value in lines[label].items():
            if f"{label}.{key}" not in DERIVED:
                assert value == shown_as(node[key]), f"{label}.{key}"


# the command as `python -m dreamer.train ARGV` runs it, with torch, torchrl and tensordict
# made unimportable: importing any of them fails the command (and W&B as if not installed)
WITHOUT_TORCH = """
import runpy, sys
sys.modules.update(dict.fromkeys(["torch", "torchrl", "tensordict", "wandb"]))
sys.argv[0] = "dreamer.train"
runpy.run_module("dreamer.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    "argv, code, first",
    [
        (["--help"], 0, "usage: python -m dreamer.train"),
        (["run.steps=-5"], 2, "error: run.steps: must be >= 1, got -5"),
        (["env=gym"], 2, "error: env.id: required for env=gym"),
        # a typo gets the closest name, as the user would type it
        (
            ["experiement=smoke"],
            2,
            "error: experiement: unknown key (did you mean experiment=smoke?); the groups are"
            " env, model, experiment (group=<option>)\n",
        ),
        (["env=cartpol"], 2, "error: env: unknown option 'cartpol' (did you mean env=cartpole?)"),
        (["rn.steps=5"], 2, "error: rn.steps: unknown key (did you mean run.steps?); allowed at"),
        (["run.stesp=5"], 2, "error: run.stesp: unknown key (did you mean run.steps?)"),
        (["env=dmc", "env.tsak=x"], 2, "error: env.tsak: unknown key (did you mean env.task?)"),
        (
            ["env=gym", "env.id=CartPol-v1"],
            2,
            "error: env.id: unknown gymnasium id 'CartPol-v1' (did you mean env.id=CartPole-v1?)\n",
        ),
        (["logger=[jsonl,wandb]"], 2, "error: logger: wandb is not installed; install it with"),
    ],
    ids=[
        "help",
        "out-of-range",
        "missing",
        "group",
        "option",
        "section",
        "key",
        "env-key",
        "id",
        "tracker",
    ],
)
def test_help_and_a_refused_command_line_answer_without_torch(argv, code, first):
    """``--help`` and a command line the config refuses answer before torch, torchrl or
    tensordict are imported (seconds of imports: the answer took 4 s)."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == code, done.stderr[-2000:]
    assert (done.stdout + done.stderr).startswith(first), done.stderr[-2000:]
    if code:
        assert done.stderr.count("\n") == 1 and done.stdout == ""


@pytest.mark.parametrize(
    "module, argv, first",
    [
        ("dreamer.evaluate", [], "error: run.logdir: required; usage: python -m dreamer.evaluate"),
        ("dreamer.evaluate", ["run.logdir=.", "eval.bogus=1"], "error: eval.bogus: not a key"),
        ("dreamer.evaluate", ["run.logdir={empty}"], "error: {empty}: no checkpoint in it"),
        (
            "dreamer.evaluate",
            ["run.logdir={empty}", "eval.checkpoint=nope.pt"],
            "error: nope.pt: no such checkpoint file",
        ),
        ("dreamer.export", ["run.logdir={empty}/gone"], "error: {empty}/gone: no such checkpoint"),
        ("dreamer.export", ["run.logdir=.", "export.format=onnx"], "error: export.format: not a"),
    ],
    ids=[
        "evaluate-no-logdir",
        "evaluate-key",
        "evaluate-empty",
        "evaluate-named",
        "export-missing",
        "export-key",
    ],
)
def test_a_refused_evaluate_or_export_answers_without_torch(module, argv, first, tmp_path):
    """``dreamer.evaluate`` and ``dreamer.export`` refuse a command line that names no
    checkpoint before torch, torchrl or tensordict are imported (it took ~3.5 s here)."""
    script = WITHOUT_TORCH.replace('"dreamer.train"', repr(module))
    argv = [arg.format(empty=tmp_path) for arg in argv]
    done = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(first.format(empty=tmp_path)), done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_help_imports_no_env_package():
    """``--help`` lists every env kind's keys from ``dreamer/envs/settings.py``: it
    imported gymnasium and Crafter for them (~0.3 s of a ~0.6 s answer)."""
    unimportable = ["gymnasium", "crafter", "ale_py", "dm_control", "mujoco", "minedojo"]
    script = WITHOUT_TORCH.replace('"tensordict"]', f'"tensordict", *{unimportable}]')
    done = subprocess.run(
        [sys.executable, "-c", script, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: python -m dreamer.train")
    assert "env.game=pong" in done.stdout and "env.task=harvest_milk" in done.stdout
