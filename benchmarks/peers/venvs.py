"""Build the virtual environment of the official DreamerV3, outside the package.

    make peers OFFICIAL_SRC=<a checkout of github.com/danijar/dreamerv3 at e3f0224>
    python3.11 benchmarks/peers/venvs.py --official-src DIR [--dry-run]   # validate only

``.venv-peers/official``: Python 3.11 with ``official-requirements.txt`` (the source is
validated and its path written to ``OFFICIAL_SRC``, never copied), checked by importing
what the benchmarks use, stamped ``.installed`` with the requirements' sha256 (a rerun
skips it or rebuilds it). A bad OFFICIAL_SRC prints one line and exits 2.
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
REQUIRED = ("dreamerv3/agent.py", "dreamerv3/configs.yaml", "embodied/jax/agent.py")
WANTED = "pass OFFICIAL_SRC=<a checkout of github.com/danijar/dreamerv3 at e3f0224>"

CHECK = """
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


def build(venv: Path, python: str, src: Path) -> None:
    """Create the venv, install its pinned requirements, check it; the stamp goes last."""
    requirements = HERE / "official-requirements.txt"
    stamp = venv / ".installed"
    expected = f"{digest(requirements)}  {requirements.name}\n"
    if stamp.is_file() and stamp.read_text() == expected:
        print(f"{venv}: up to date ({stamp.name} matches {requirements.name})", flush=True)
        (venv / "OFFICIAL_SRC").write_text(f"{src}\n")
        return
    if venv.exists():  # stale requirements or a build that broke off
        print(f"{venv}: rebuilding", flush=True)
        shutil.rmtree(venv)
    start = time.monotonic()
    run(python, "-m", "venv", venv)
    (venv / "OFFICIAL_SRC").write_text(f"{src}\n")
    run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", "-r", requirements)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUJOCO_GL")}
    env["PYTHONPATH"] = str(src)
    run(venv / "bin" / "python", "-W", "ignore", "-c", CHECK, src, env=env)
    stamp.write_text(expected)
    print(f"{venv}: built in {time.monotonic() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--official-src",
        default=os.environ.get("OFFICIAL_SRC"),
        help="a checkout of github.com/danijar/dreamerv3 at e3f0224 (default: $OFFICIAL_SRC)",
    )
    parser.add_argument("--only", choices=("official",), help="the one venv (kept for scripts)")
    parser.add_argument("--root", type=Path, default=ROOT, help="where .venv-peers/ goes")
    parser.add_argument("--python", default="python3.11", help="the venv's interpreter")
    parser.add_argument("--dry-run", action="store_true", help="validate, create nothing")
    args = parser.parse_args(argv)
    try:
        src = official_src(args.official_src)
        python = python311(args.python)
    except BadInput as error:
        print(f"make peers: {error}", file=sys.stderr)
        return 2
    venv = args.root.resolve() / ".venv-peers" / "official"
    if args.dry_run:
        print(f"would build {venv} with {python} (OFFICIAL_SRC={src})")
        return 0
    try:
        build(venv, python, src)
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
