"""One DreamerV3 training update, ours and the official's, timed in the same window.

    .venv/bin/python benchmarks/peers/update.py [--obs vector image] [--threads 1 2]
        [--updates 10] [--warmup 2] [--quick] [--impls ours official]
        [--ours-modes eager compiled] [--official-dtypes float32 bfloat16]
        [--no-strided] [--json PATH] [--logs DIR]

size1m, a random 16 x 64 batch, 15 imagined steps from every replayed state; the train
step alone. ``ours`` (``update_ours.py``; images: the official-style CNN and, unless
``--no-strided``, torchrl's strided one) and ``official`` (``update_official.py``, from
the source ``make peers`` recorded) each run in a worker under their own venv, confined
to ``threads`` cores by CPU affinity, built and warmed up in turn; the timed updates are
interleaved, the order rotating each round. ``--json`` (default
``benchmarks/results/peers_update.json``) holds every row (median ``s_per_update``,
samples, CPU over wall, ours' FLOPs, parameters), ours-vs-official ratios per update, and
where the two still differ; bad input prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.procs import cpu_model  # noqa: E402

PEERS = ROOT / ".venv-peers"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "peers_update.json"
OBS = ("vector", "image")
IMPLS = ("ours", "official")


class Usage(Exception):
    """Bad input: one line on stderr, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise Usage(message)


@dataclass
class Row:
    """One implementation in one mode: its worker and its build arguments."""

    name: str
    impl: str
    build: dict
    worker: subprocess.Popen | None = None
    log: Path | None = None
    info: dict = field(default_factory=dict)
    samples: list = field(default_factory=list)
    cpu: list = field(default_factory=list)
    error: str | None = None


def python_of(impl: str) -> list[str]:
    """The command that starts ``impl``'s worker; Usage if its venv is not installed."""
    if impl == "ours":
        return [sys.executable, str(HERE / "update_ours.py")]
    venv = PEERS / impl
    if not (venv / ".installed").exists():
        raise Usage(
            f"the {impl} venv {venv} is not installed (no .installed); leave it out with --impls"
        )
    source_file = venv / "OFFICIAL_SRC"
    if not source_file.exists():
        raise Usage(f"{source_file} is missing: it names the official source tree")
    source = source_file.read_text().strip()
    if not (Path(source) / "dreamerv3" / "configs.yaml").exists():
        raise Usage(f"{source_file} names {source}, which has no dreamerv3/configs.yaml")
    return [str(venv / "bin" / "python"), str(HERE / "update_official.py"), source]


def rows_for(args, obs: str) -> list[Row]:
    size = {"batch": args.batch, "length": args.length, "obs": obs}
    rows = []
    if "ours" in args.impls:
        styles = [("", True)]
        if obs == "image":
            styles = [("", False)] + ([] if args.no_strided else [("_strided", True)])
        for suffix, strided in styles:
            for mode in args.ours_modes:
                build = {**size, "mode": mode, "strided": strided}
                rows.append(Row(f"ours/{mode}{suffix}", "ours", build))
    if "official" in args.impls:
        for dtype in args.official_dtypes:
            rows.append(Row(f"official/{dtype}", "official", {**size, "dtype": dtype}))
    return rows


def ask(row: Row, cmd: str, **kwargs) -> dict:
    """One command to ``row``'s worker and its answer; RuntimeError if it fails."""
    row.worker.stdin.write(json.dumps({"cmd": cmd, **kwargs}) + "\n")
    row.worker.stdin.flush()
    line = row.worker.stdout.readline()
    if not line:
        tail = row.log.read_text().splitlines()[-5:] if row.log.exists() else []
        raise RuntimeError(f"worker exited ({' | '.join(tail)})")
    answer = json.loads(line)
    if not answer.pop("ok"):
        raise RuntimeError(answer["error"])
    return answer


def start(row: Row, threads: int, logs: Path) -> None:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    row.log = logs / f"{row.name.replace('/', '_')}_{row.build['obs']}_{threads}t.log"
    cores = sorted(os.sched_getaffinity(0))[:threads]
    confine = None
    if len(cores) < len(os.sched_getaffinity(0)):
        confine = lambda: os.sched_setaffinity(0, cores)  # noqa: E731  (in the child, before exec)
    row.worker = subprocess.Popen(
        python_of(row.impl),
        preexec_fn=confine,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=row.log.open("w"),
        text=True,
        env=env,
        cwd=ROOT,
    )


def stop(row: Row) -> None:
    if row.worker is None:
        return
    try:
        if row.worker.poll() is None:
            ask(row, "quit")
        row.worker.wait(timeout=60)
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        row.worker.kill()
        row.worker.wait()
    row.worker = None


def run_pass(args, obs: str, threads: int, flops: dict, logs: Path) -> dict:
    """Build and warm up every row, then interleave the timed updates."""
    rows = rows_for(args, obs)
    print(f"\n## {obs}, {threads} thread(s)", flush=True)
    try:
        for row in rows:
            started = time.perf_counter()
            try:
                start(row, threads, logs)
                row.info = ask(row, "build", threads=threads, **row.build)
                row.info["build_s"] = time.perf_counter() - started
                for _ in range(args.warmup):  # compiles where it compiles
                    ask(row, "update")
                row.info["warmup_s"] = time.perf_counter() - started
                key = (row.name, obs)
                if key not in flops:
                    flops[key] = ask(row, "flops")
                print(
                    f"{row.name}: built and warmed up in {row.info['warmup_s']:.0f} s", flush=True
                )
            except RuntimeError as error:
                row.error = str(error)
                print(f"{row.name}: FAILED: {row.error} (log {row.log})", flush=True)
                stop(row)
        live = [row for row in rows if row.error is None]
        for turn in range(args.updates):
            first = turn % max(1, len(live))
            for row in live[first:] + live[:first]:  # the order rotates every round
                if row.error is not None:
                    continue
                try:
                    answer = ask(row, "update")
                except RuntimeError as error:
                    row.error = str(error)
                    continue
                row.samples.append(answer["s"])
                row.cpu.append(answer["cpu_s"])
    finally:
        for row in rows:
            stop(row)
    results = {row.name: summary(row, flops.get((row.name, obs), {})) for row in rows}
    cores = sorted(os.sched_getaffinity(0))
    confined = cores[:threads] if threads < len(cores) else None
    return {
        "obs": obs,
        "threads": threads,
        "cpu_affinity": confined,
        "rows": results,
        "ratios": ratios(results),
    }


def summary(row: Row, counted: dict) -> dict:
    out = {"impl": row.impl, "build": row.build}
    if row.error is not None:
        out["error"] = row.error
    if row.samples:
        seconds = statistics.median(row.samples)
        ratio = statistics.median(c / s for c, s in zip(row.cpu, row.samples))
        out.update(s_per_update=seconds, samples=row.samples, cpu_s=row.cpu, cpu_per_wall=ratio)
        out["updates_per_s"] = 1 / seconds
        if counted.get("flops"):
            out["gflops_per_s"] = counted["flops"] / seconds / 1e9
    if counted:
        out["flops_per_update"] = counted.get("flops")
        out["flops"] = {k: v for k, v in counted.items() if k != "flops"}
    out.update(row.info)
    return out


def ratios(results: dict) -> dict:
    """Each of our rows against each peer row: per update (the peer's seconds over ours:
    above 1, ours is faster) and per FLOP (our executed FLOP/s over the peer's)."""
    timed = {name: r for name, r in results.items() if "s_per_update" in r}
    out = {}
    for ours, mine in timed.items():
        if mine["impl"] != "ours":
            continue
        for peer, theirs in timed.items():
            if theirs["impl"] == "ours":
                continue
            entry = {"per_update": theirs["s_per_update"] / mine["s_per_update"]}
            if mine.get("gflops_per_s") and theirs.get("gflops_per_s"):
                entry["per_flop"] = mine["gflops_per_s"] / theirs["gflops_per_s"]
            out[f"{ours} vs {peer}"] = entry
    return out


def differences(passes: list[dict]) -> list[str]:
    """Where the networks and the update still differ (each row's ``optimizer`` too),
    with the parameters the workers built."""
    out = []
    for run in passes:
        built = {r["impl"]: (name, r) for name, r in reversed(run["rows"].items()) if "params" in r}
        parts = ", ".join(
            f"{name} " + " / ".join(f"{k} {v:,}" for k, v in r["params"].items())
            for name, r in built.values()
        )
        out.append(f"{run['obs']}, {run['threads']} thread(s): parameters: {parts}")
    return out + [
        "image CNNs: the official's stride-1 convolutions with pooling and upsampling; ours "
        "the same with model.cnn_strided=false, torchrl's stride-2 ones with true (the "
        "*_strided rows: 4x fewer convolution FLOPs)",
        "official: its default compute dtype is bfloat16; ours computes in float32",
        "official: its train call also refreshes the policy's copy of the parameters",
        "the batch: random, with replay context 1 for the official (16 x 65); ours starts "
        "from zeros (16 x 64): the same 1,024 trained steps",
        "FLOPs: ours' matmuls and convolutions by torch's formulas; the official's "
        "cost_analysis() counts a scan's body once (counted from its HLO: 29.1 GFLOP vector)",
    ]


def machine() -> dict:
    cores = {"cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0))}
    versions = {"platform": platform.platform(), "python": platform.python_version()}
    return {"cpu": cpu_model(), **cores, **versions, "load_average_start": os.getloadavg()}


def table(run: dict) -> str:
    lines = [
        f"\n{run['obs']}, {run['threads']} thread(s)",
        "| row | s/update | updates/s | GFLOP/update | GFLOP/s | CPU/wall | warm-up s | params |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in run["rows"].items():
        if "s_per_update" not in r:
            lines.append(f"| {name} | failed: {r.get('error', 'no sample')[:80]} | | | | | | |")
            continue
        gflop = (r.get("flops_per_update") or 0) / 1e9
        lines.append(
            f"| {name} | {r['s_per_update']:.3f} | {r['updates_per_s']:.2f} | {gflop:.1f} | "
            f"{r.get('gflops_per_s', 0):.1f} | {r['cpu_per_wall']:.2f} | "
            f"{r.get('warmup_s', 0):.0f} | "
            f"{r.get('params', {}).get('total', 0):,} |"
        )
    if run["ratios"]:
        lines += ["", "| ours vs peer | per update (peer s / ours s) | per FLOP |", "|---|---|---|"]
        for pair, r in run["ratios"].items():
            per_flop = f"{r['per_flop']:.2f}x" if "per_flop" in r else ""
            lines.append(f"| {pair} | {r['per_update']:.2f}x | {per_flop} |")
    return "\n".join(lines)


def parse(argv: list[str]):
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--obs", nargs="+", default=["vector"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--updates", type=int, default=10, help="timed updates per row")
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates per row")
    parser.add_argument("--quick", action="store_true", help="1 warm-up, 2 timed updates")
    parser.add_argument("--impls", nargs="+", default=list(IMPLS))
    parser.add_argument("--ours-modes", nargs="+", default=["eager", "compiled"])
    parser.add_argument("--official-dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--no-strided", action="store_true", help="images: no strided-CNN rows")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--logs", type=Path, help="the workers' stderr (default: a temp dir)")
    args = parser.parse_args(argv)
    checks = [
        ("--obs", args.obs, OBS),
        ("--impls", args.impls, IMPLS),
        ("--ours-modes", args.ours_modes, ("eager", "compiled")),
        ("--official-dtypes", args.official_dtypes, ("float32", "bfloat16")),
    ]
    for flag, values, allowed in checks:
        for value in values:
            if value not in allowed:
                raise Usage(f"{flag}: unknown {value!r}; allowed: {', '.join(allowed)}")
    if any(t < 1 for t in args.threads) or args.updates < 1 or args.warmup < 0:
        raise Usage("--threads and --updates must be at least 1, --warmup at least 0")
    if args.quick:
        args.warmup, args.updates = 1, 2
    for impl in args.impls:
        python_of(impl)  # a missing venv: Usage before anything runs
    return args


def main(argv: list[str]) -> int:
    try:
        args = parse(argv)
    except Usage as error:
        print(f"update.py: {error}", file=sys.stderr)
        return 2
    logs = args.logs or Path(tempfile.mkdtemp(prefix="peers_update_"))
    logs.mkdir(parents=True, exist_ok=True)
    info = machine()
    flops: dict = {}
    passes = []
    for threads in args.threads:
        for obs in args.obs:
            run = run_pass(args, obs, threads, flops, logs)
            passes.append(run)
            print(table(run), flush=True)
    info["load_average_end"] = os.getloadavg()
    payload = {
        "machine": info,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        **{key: getattr(args, key) for key in ("batch", "length", "warmup", "updates")},
        **{"threads": args.threads, "obs": args.obs},
        "passes": passes,
        "differences": differences(passes),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nJSON: {args.json}; worker logs: {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
