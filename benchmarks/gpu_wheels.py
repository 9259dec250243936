"""The wheels the offline GPU machine installs: the project's dependency closure as this
venv resolves it, for CPython 3.12 on manylinux x86_64, less what its image holds.

    python benchmarks/gpu_wheels.py build [--dir .whl]   # make gpu-wheels
    python benchmarks/gpu_wheels.py check [--dir .whl]   # gpu_check.sh --dry-run
    python benchmarks/gpu_wheels.py install --site DIR   # likewise: the offline install

``check`` proves the folder complete offline: one wheel per pinned name at this venv's
version, and pip resolving the closure for cp312 from it alone (the image's packages as
metadata-only stub wheels).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parent.parent
PYTHON_VERSION = "3.12"
PLATFORMS = [  # pip matches manylinux_2_N exactly, so name every one the machine accepts
    *(f"manylinux_2_{n}_x86_64" for n in (28, 27, 24, 17)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
# In the GPU machine's image already (torch 2.11.0 built for CUDA 13): carried, they
# would shadow the image's CUDA build or burst the size limit.
IMAGE = {"torch": "2.11.0"} | dict.fromkeys(
    ("numpy", "matplotlib", "tensorboard", "tqdm", "filelock", "pytest")
)
# 68 MB on its own, over the machine's limit: videos fall back to GIF there.
LEFT_OUT = {"imageio-ffmpeg"}
LIMIT_BYTES = 64 * 2**20
# gpu_check.sh's Atari step (ale-py's 3 MB wheel holds the ROMs); MuJoCo and the trackers
# stay behind
CARRIED_EXTRAS = ("atari",)


def target_environment() -> dict[str, str]:
    """Marker values of the GPU machine's interpreter (CPython 3.12, Linux x86_64)."""
    env = default_environment()
    env.update(
        python_version=PYTHON_VERSION,
        python_full_version=f"{PYTHON_VERSION}.3",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
    )
    return env


def project_requirements() -> list[Requirement]:
    """The project's run-time dependencies and CARRIED_EXTRAS', less LEFT_OUT."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in CARRIED_EXTRAS:
        lines += project["optional-dependencies"][extra]
    reqs = [Requirement(line) for line in lines]
    return [r for r in reqs if canonicalize_name(r.name) not in LEFT_OUT]


def applies(req: Requirement, env: dict[str, str], extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": extra}) for extra in extras or {""})


def pins() -> dict[str, str]:
    """name -> version this venv holds, for the closure of the project's requirements on
    the target interpreter, not descending into the image's packages."""
    env = target_environment()
    found: dict[str, str] = {}
    todo = [(r, set(r.extras)) for r in project_requirements()]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if name in IMAGE or name in LEFT_OUT:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            sys.exit(
                f"gpu_wheels: {req.name} is needed on Python {PYTHON_VERSION} but not "
                "installed here; install the project (make install) first"
            )
        version = dist.version
        if not req.specifier.contains(version, prereleases=True):
            sys.exit(f"gpu_wheels: installed {req.name} {version} does not satisfy {req}")
        if name in found and not extras:
            continue
        found[name] = version
        for line in dist.requires or []:
            sub = Requirement(line)
            if applies(sub, env, extras):
                todo.append((sub, set(sub.extras)))
    return dict(sorted(found.items()))


def target_args() -> list[str]:
    """pip's options selecting wheels for the GPU machine's interpreter and platform."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    return ["--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON_VERSION,
            *platforms]  # fmt: skip


def pip(*args: str, offline: bool = False) -> subprocess.CompletedProcess:
    """This interpreter's pip; ``offline`` also ignores this machine's pip configuration
    (its find-links and mirrors), so only the folder given can satisfy a requirement."""
    env = dict(os.environ)
    if offline:
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run(
        [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"],
        env=env,
        capture_output=True,
        text=True,
    )


def wheels(folder: Path) -> dict[str, list[Path]]:
    by_name: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("*.whl")):
        by_name.setdefault(str(parse_wheel_filename(path.name)[0]), []).append(path)
    return by_name


def wheel_version(path: Path) -> str:
    return str(parse_wheel_filename(path.name)[1])


def fetch(wanted: dict[str, str], folder: Path) -> dict[str, str]:
    """Each wheel of name==version into folder: "binary" where the index has a cp312 one
    (one pip for them all: a pip per wheel cost ~1 CPU-s each), else "built" from source."""
    how, todo = {}, dict(wanted)
    while todo:
        specs = [f"{name}=={version}" for name, version in todo.items()]
        done = pip("download", "--quiet", "--no-deps", *target_args(), "-d", str(folder), *specs)
        if done.returncode == 0:
            return how | dict.fromkeys(todo, "binary")
        # pip resolves every name before it downloads any, and names the first it cannot
        found = re.search(r"No matching distribution found for (\S+)", done.stderr)
        name = found and canonicalize_name(Requirement(found[1]).name)
        if name not in todo:
            sys.exit(f"gpu_wheels: pip download failed:\n{done.stderr.strip()}")
        how[name] = build_from_source(name, todo.pop(name), folder, done.stderr)
    return how


def build_from_source(name: str, version: str, folder: Path, why: str) -> str:
    """Source-only on the index: pure-Python sdists build to py3-none-any wheels."""
    spec = f"{name}=={version}"
    built = pip("wheel", "--quiet", "--no-deps", "--no-binary", name, "-w", str(folder), spec)
    if built.returncode != 0:
        sys.exit(
            f"gpu_wheels: no cp312 wheel for {spec} and building one failed:\n"
            f"{why.strip()}\n{built.stderr.strip()}"
        )
    return "built"


def build(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    wanted = pins()
    for name, paths in wheels(folder).items():
        for path in paths:
            if wanted.get(name) != wheel_version(path):
                path.unlink()  # stale: another version, or no longer needed
    have = wheels(folder)
    how = fetch({name: v for name, v in wanted.items() if name not in have}, folder)
    for name, version in wanted.items():
        print(f"{name}=={version}: {how.get(name, 'kept')}", flush=True)
    return report(folder, wanted)


def tracked_bytes() -> int:
    """The repository's tracked files, which travel to the GPU machine with the wheels."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    paths = [ROOT / name for name in listed.stdout.decode().split("\0") if name]
    return sum(path.stat().st_size for path in paths if path.is_file())


def report(folder: Path, wanted: dict[str, str]) -> int:
    have = wheels(folder)
    total = sum(p.stat().st_size for paths in have.values() for p in paths)
    tree = tracked_bytes()
    print(
        f"{len(have)} wheels in {folder}, {total / 2**20:.1f} MiB; with the tracked files "
        f"{(total + tree) / 2**20:.1f} MiB of the {LIMIT_BYTES >> 20} MiB that travel"
    )
    if total + tree > LIMIT_BYTES:
        print(f"gpu_wheels: {total + tree} bytes exceed the GPU machine's 64 MiB")
        return 1
    return 0


def stub_wheel(folder: Path, name: str, version: str) -> None:
    """A metadata-only wheel standing in for a package the GPU image already holds."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as archive:
        archive.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")


def check(folder: Path) -> int:
    """0 when folder holds exactly the pinned closure for cp312 and pip resolves the
    project from it offline; otherwise one line per problem and 1."""
    wanted = pins()
    have = wheels(folder)
    problems = []
    for name, version in wanted.items():
        versions = [wheel_version(p) for p in have.get(name, [])]
        if versions != [version]:
            problems.append(f"{name}: want {version}, folder has {versions or 'none'}")
    problems += [f"{name}: not in the closure" for name in have if name not in wanted]
    with tempfile.TemporaryDirectory() as scratch:
        stubs = Path(scratch) / "image"
        stubs.mkdir()
        for name, version in IMAGE.items():
            stub_wheel(stubs, name, version or metadata.version(name))
        requirements = [str(r) for r in project_requirements()]
        report_path = Path(scratch) / "report.json"
        offline = ["--dry-run", "--quiet", "--no-index", "--ignore-installed"]
        offline += ["--find-links", str(folder), "--find-links", str(stubs)]
        offline += ["--target", str(Path(scratch) / "target"), "--report", str(report_path)]
        done = pip("install", *offline, *target_args(), *requirements, offline=True)
        if done.returncode != 0:
            problems.append("pip cannot resolve the project offline for cp312:\n" + done.stderr)
        else:
            installs = json.loads(report_path.read_text())["install"]
            resolved = {
                canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs
            }
            for name, version in resolved.items():
                if name not in IMAGE and wanted.get(name) != version:
                    problems.append(f"pip resolved {name} {version}, pinned {wanted.get(name)}")
            problems += [
                f"{name}: carried, but pip needs it not" for name in wanted if name not in resolved
            ]
            image = [name for name in resolved if name in IMAGE]
            print(
                f"pip resolves the project offline for cp312: {len(resolved)} packages, "
                f"{len(resolved) - len(image)} from {folder}, {len(image)} from the image"
            )
    for problem in problems:
        print(f"gpu_wheels: {problem}")
    return report(folder, wanted) or int(bool(problems))


def install(folder: Path, site: Path) -> int:
    """The GPU machine's install command (offline, no dependencies, into a target folder),
    here for its interpreter and platform: every wheel must unpack with its metadata."""
    paths = [str(p) for paths in wheels(folder).values() for p in paths]
    offline = ["--quiet", "--no-index", "--no-deps", "--no-compile", "--target", str(site)]
    done = pip("install", *offline, *target_args(), *paths, offline=True)
    if done.returncode != 0:
        print(f"gpu_wheels: the offline install failed:\n{done.stderr}")
        return 1
    installed = {
        canonicalize_name(d.metadata["Name"]) for d in metadata.distributions(path=[str(site)])
    }
    missing = sorted(set(wheels(folder)) - installed)
    if missing:
        print(f"gpu_wheels: installed without metadata: {', '.join(missing)}")
        return 1
    print(f"offline install into {site}: {len(installed)} packages")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["build", "check", "install", "pins"])
    parser.add_argument("--dir", type=Path, default=ROOT / ".whl")
    parser.add_argument("--site", type=Path, help="install: the target folder")
    args = parser.parse_args()
    if args.action == "pins":
        print("\n".join(f"{n}=={v}" for n, v in pins().items()))
        return 0
    if args.action == "install":
        return install(args.dir, args.site)
    return build(args.dir) if args.action == "build" else check(args.dir)


if __name__ == "__main__":
    sys.exit(main())
