"""The project as a wheel: installed (not editable) into a fresh venv outside the
checkout, it finds its configs and trains, reading nothing from the source tree."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from dreamer.command_line import load

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    "pyproject.toml",
    "README.md",
    "Makefile",
    "dreamer",
    "conf",
    "tests",
    "benchmarks",
    "slurm",
)
TIMEOUT = 300


def run(args: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built offline from a copy of the checkout (setuptools builds in the
    source tree, leaving build/ and *.egg-info there; the copy keeps the checkout clean)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        elif (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", "out"]
        + [str(source)], work)  # fmt: skip
    (built,) = (work / "out").glob("dreamer_torchrl-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel; the dependencies come from this venv's
    site-packages through a path line in a .pth file (no download). Python does not
    process the .pth files of a directory added that way, so the editable install of
    the checkout there stays out of the new venv."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(root)], root.parent)
    python = root / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)], root.parent)
    site = run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               root.parent).stdout.strip()  # fmt: skip
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    return python


@pytest.mark.slow
def test_the_wheel_ships_the_configs_and_only_the_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("dreamer/") for n in names if n.endswith(".yaml")}
    presets = {str(p.relative_to(ROOT)) for p in (ROOT / "conf").rglob("*.yaml")}
    assert "conf/config.yaml" in presets and shipped == presets
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {n.split("/")[0] for n in names} == {"dreamer", dist_info}  # no tests/, benchmarks/


@pytest.mark.slow
def test_the_installed_package_composes_its_config_and_trains(venv, tmp_path):
    where = run([venv, "-I", "-c", "import dreamer; print(dreamer.__file__)"], tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(venv.parent.parent)

    shown = run([venv, "-I", "-m", "dreamer.train", "--cfg", "job", "experiment=smoke"], tmp_path)
    composed = yaml.safe_load(shown.stdout)
    expected = OmegaConf.to_container(load(["experiment=smoke"]))
    assert composed["env"] == expected["env"] and composed["model"] == expected["model"]
    assert composed["model"]["name"] == "tiny"  # the smoke preset's override took effect

    logdir = tmp_path / "run"
    smoke = ["experiment=smoke", "run.steps=200", "run.train_starts=100", "eval.every=0"]
    run([venv, "-I", "-m", "dreamer.train", *smoke, f"run.logdir={logdir}"], tmp_path)
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] == 200
    assert list((logdir / "checkpoints").glob("checkpoint-*200.pt"))
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # nothing outside run.logdir
