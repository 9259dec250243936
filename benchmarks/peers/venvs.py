"""Build the virtual environments of the peer DreamerV3 implementations, outside the package.

    make peers OFFICIAL_SRC=<a checkout of github.com/danijar/dreamerv3 at e3f0224>
    python3.11 benchmarks/peers/venvs.py --official-src DIR [--only official|sheeprl]
    python3.11 benchmarks/peers/venvs.py --official-src DIR --dry-run   # validate only

Builds, under ``<root>/.venv-peers/`` (``--root``, by default the repository):

- ``official``: a Python 3.11 venv with the official DreamerV3's dependencies for the CPU
  (CPU jax/jaxlib 0.4.33, ninjax, elements, portal, granular, optax, chex, numpy 1.26.4,
  the rest of its ``requirements.txt`` that building the agent and its DMC training loop
  need, dm-control 1.0.50 with mujoco 3.17.0), every version pinned in
  ``official-requirements.txt``. PyPI packages only: the official source is never copied,
  built or installed. It is validated and its absolute path is written to
  ``.venv-peers/official/OFFICIAL_SRC``; a harness puts that directory on ``sys.path`` at
  run time (``PYTHONPATH=$(cat .venv-peers/official/OFFICIAL_SRC)``).
- ``sheeprl``: torch==2.13.0 installed first and alone (pip takes the CPU wheel on this
  machine's disk; any other torch request downloads a multi-GB CUDA build), then
  ``sheeprl-requirements.txt`` (sheeprl 0.8.4, dm-control 1.0.50 with mujoco 3.17.0).

Each venv is checked by importing what the benchmarks use (the official ``dreamerv3`` and
``embodied`` from the source with jax on the CPU and dm_control's cartpole; sheeprl's
``dreamer_v3`` and ``dreamer_v3_5`` agents with torch 2.13.0 CPU), and only then stamped
``.installed`` with its requirements file's sha256: a rerun skips a venv whose stamp
matches and rebuilds one whose requirements changed or whose build broke off. Rendering
(the official DMC env renders every step) needs ``MUJOCO_GL=osmesa`` and Debian's
libosmesa6 (``make osmesa``).

OFFICIAL_SRC is validated before anything is created: unset, not a directory, or not the
official source (``dreamerv3/agent.py``, ``dreamerv3/configs.yaml``, ``embodied/jax/agent.py``)
prints one line on stderr and exits 2. ``--only sheeprl`` does not need it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
NAMES = ("official", "sheeprl")
REQUIRED = ("dreamerv3/agent.py", "dreamerv3/configs.yaml", "embodied/jax/agent.py")
WANTED = "pass OFFICIAL_SRC=<a checkout of github.com/danijar/dreamerv3 at e3f0224>"
TORCH = "torch==2.13.0"

OFFICIAL_CHECK = """
import os, sys
src = os.path.realpath(sys.argv[1])
import jax, numpy, dm_control, mujoco
import dreamerv3, embodied
from dreamerv3 import agent
import embodied.envs.dmc
for module in (dreamerv3, embodied):
    assert os.path.realpath(module.__file__).startswith(src + os.sep), module.__file__
devices = jax.devices()
assert devices[0].platform == 'cpu', devices
from dm_control import suite
step = suite.load('cartpole', 'balance').reset()
print('jax', jax.__version__, devices, 'numpy', numpy.__version__, 'mujoco', mujoco.__version__,
      'cartpole', sorted(step.observation))
"""

SHEEPRL_CHECK = """
import sheeprl, torch
assert torch.__version__.split('+')[0] == '2.13.0' and torch.version.cuda is None, torch.__version__
import sheeprl.algos.dreamer_v3.agent, sheeprl.algos.dreamer_v3.dreamer_v3
import sheeprl.algos.dreamer_v3_5.agent, sheeprl.algos.dreamer_v3_5.dreamer_v3_5
import sheeprl.envs.dmc
from dm_control import suite
step = suite.load('cartpole', 'balance').reset()
print('sheeprl', sheeprl.__version__, 'torch', torch.__version__,
      'cartpole', sorted(step.observation))
"""


class BadInput(Exception):
    """What is wrong with the command line, in one line."""


def official_src(value: str | None) -> Path:
    """The official source's absolute path, or BadInput saying what is wrong with it."""
    if not value:
        raise BadInput(f"OFFICIAL_SRC is not set; {WANTED}")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise BadInput(f"OFFICIAL_SRC={value} is not a directory; {WANTED}")
    missing = [name for name in REQUIRED if not (path / name).is_file()]
    if missing:
        raise BadInput(
            f"OFFICIAL_SRC={value} is not the official DreamerV3 source "
            f"(no {', '.join(missing)}); {WANTED}"
        )
    return path.resolve()


def python311(python: str) -> str:
    found = shutil.which(python)
    if found is None:
        raise BadInput(f"{python} not found; pass PYTHON=<a Python 3.11 interpreter>")
    version = subprocess.run(
        [found, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if version != "3.11":
        raise BadInput(f"{python} is Python {version or '?'}, not 3.11; pass PYTHON=python3.11")
    return found


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(*command: str | Path, env: dict[str, str] | None = None) -> None:
    shown = (str(part) if "\n" not in str(part) else "'<check>'" for part in command)
    print("+", " ".join(shown), flush=True)
    subprocess.run([str(part) for part in command], check=True, env=env)


def build(name: str, venv: Path, python: str, src: Path | None) -> None:
    """Create the venv, install its pinned requirements, check it; the stamp goes last."""
    requirements = HERE / f"{name}-requirements.txt"
    stamp = venv / ".installed"
    expected = f"{digest(requirements)}  {requirements.name}\n"
    if stamp.is_file() and stamp.read_text() == expected:
        print(f"{venv}: up to date ({stamp.name} matches {requirements.name})", flush=True)
        if src is not None:
            (venv / "OFFICIAL_SRC").write_text(f"{src}\n")
        return
    if venv.exists():  # stale requirements or a build that broke off
        print(f"{venv}: rebuilding", flush=True)
        shutil.rmtree(venv)
    start = time.monotonic()
    run(python, "-m", "venv", venv)
    if src is not None:
        (venv / "OFFICIAL_SRC").write_text(f"{src}\n")
    pip = (venv / "bin" / "python", "-m", "pip", "install", "--quiet")
    if name == "sheeprl":
        run(*pip, TORCH)  # first, alone: the CPU wheel
    run(*pip, "-r", requirements)
    check(name, venv, src)
    stamp.write_text(expected)
    print(f"{venv}: built in {time.monotonic() - start:.0f} s", flush=True)


def check(name: str, venv: Path, src: Path | None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUJOCO_GL")}
    if name == "official":
        env["PYTHONPATH"] = str(src)
        code, args = OFFICIAL_CHECK, [str(src)]
    else:
        code, args = SHEEPRL_CHECK, []
    run(venv / "bin" / "python", "-W", "ignore", "-c", code, *args, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--official-src",
        default=os.environ.get("OFFICIAL_SRC"),
        help="a checkout of github.com/danijar/dreamerv3 at e3f0224 (default: $OFFICIAL_SRC)",
    )
    parser.add_argument("--only", choices=NAMES, help="build one venv")
    parser.add_argument("--root", type=Path, default=ROOT, help="where .venv-peers/ goes")
    parser.add_argument("--python", default="python3.11", help="the venvs' interpreter")
    parser.add_argument("--dry-run", action="store_true", help="validate, create nothing")
    args = parser.parse_args(argv)
    names = [args.only] if args.only else list(NAMES)
    try:
        src = official_src(args.official_src) if "official" in names else None
        python = python311(args.python)
    except BadInput as error:
        print(f"make peers: {error}", file=sys.stderr)
        return 2
    prefix = args.root.resolve() / ".venv-peers"
    for name in names:
        venv = prefix / name
        source = src if name == "official" else None
        if args.dry_run:
            origin = f" (OFFICIAL_SRC={source})" if source else ""
            print(f"would build {venv} with {python}{origin}")
            continue
        try:
            build(name, venv, python, source)
        except subprocess.CalledProcessError as error:
            command = " ".join(str(part) for part in error.cmd[:4])
            print(
                f"make peers: {command} ... exited {error.returncode}; rerun to rebuild {venv}",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
