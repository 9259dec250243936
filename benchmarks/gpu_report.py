"""gpu_check.sh's last step: gpu.json and summary.md in OUT from what its steps left in
WORK (partial results too), then a check that OUT fits what comes back from the GPU
machine. Exit 1 when a step failed or ran out of time, or OUT breaks a limit.

    python benchmarks/gpu_report.py WORK OUT [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.procs import jsonl_rows  # noqa: E402

# what comes back from the GPU machine's $OUT
MAX_FILES, MAX_DEPTH, MAX_BYTES = 8, 2, 16 * 2**20
NAME = re.compile(r"^[A-Za-z0-9._-]+$")
# the reference run (shared/CONTEXT.md): updates/s at 32 x 256 on one 4-GPU node
REFERENCE_NODE_UPDATES_PER_S = 2.44
MODE_LINE = re.compile(r"^(\w+): ([0-9.]+) s/update \(set-up and warm-up ([0-9.]+) s\)$")


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps(work: Path) -> dict[str, dict]:
    rows = {}
    if (work / "steps.tsv").exists():
        for line in (work / "steps.tsv").read_text().splitlines():
            name, rc, seconds = line.split("\t")
            status = "skipped" if rc == "skipped" else "ok" if rc == "0" else "failed"
            status = "timed out" if rc in ("124", "137") else status
            rows[name] = {"status": status, "exit": rc, "seconds": int(seconds)}
    return rows


def learner(work: Path) -> dict[str, dict]:
    """Per ``model/BxL``: the matmul roof and per mode updates/s, replayed steps/s and
    TFLOP/s with its share of the roof; modes printed before a time-out count too."""
    results = {}
    for text in sorted(work.glob("learner-*.txt")):
        _, model, shape = text.stem.split("-")
        batch, length = (int(n) for n in shape.split("x"))
        payload = read_json(text.with_suffix(".json")) or {}
        modes = payload.get("modes", {})
        for line in text.read_text().splitlines():
            match = MODE_LINE.match(line.strip())
            if match and match[1] not in modes:
                seconds = float(match[2])
                modes[match[1]] = {
                    "updates_per_s": 1 / seconds,
                    "replayed_steps_per_s": batch * length / seconds,
                    "setup_s": float(match[3]),
                }
        roof = payload.get("roof_flops_per_s")
        for mode in modes.values():
            if mode.get("flops_per_update"):
                mode["flops_per_s"] = mode["flops_per_update"] * mode["updates_per_s"]
                mode["tflops"] = mode["flops_per_s"] / 1e12
                if roof:
                    mode["roof_share"] = mode["flops_per_s"] / roof
        results[f"{model}/{batch}x{length}"] = {
            "roof_flops_per_s": roof,
            "complete": bool(payload),
            "modes": modes,
        }
    return results


def trainer(work: Path, name: str = "trainer") -> dict | None:
    """The last metrics row of the trainer run in ``work/name``."""
    rows = jsonl_rows(work / name / "metrics.jsonl")
    if not rows:
        return None
    last = rows[-1]
    keys = ("updates", "env_steps", "updates_per_s", "env_steps_per_s", "learner/skipped")
    result = {key: last.get(key) for key in keys}
    result["loss_finite"] = all(
        value == value and abs(value) != float("inf")
        for key, value in last.items()
        if key.startswith("loss") and isinstance(value, float)
    )
    return result


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator and denominator else None


def goals(report: dict) -> dict[str, dict]:
    """The issue's goals on the H200, each with its measured ratio (None: not measured)."""

    def rate(shape: str, mode: str) -> float | None:
        return report["learner"].get(shape, {}).get("modes", {}).get(mode, {}).get("updates_per_s")

    out = {}
    for shape in report["learner"]:
        ours = rate(shape, "compiled_cudagraph_bf16")
        out[f"{shape}: ours compiled vs eager fp32 >= 3"] = (
            ratio(ours, rate(shape, "eager_fp32")),
            3.0,
        )
    node = rate("size50m/32x256", "compiled_cudagraph_bf16")
    out["size50m/32x256 one GPU vs the reference 4-GPU node (2.44 updates/s)"] = (
        ratio(node, REFERENCE_NODE_UPDATES_PER_S),
        None,
    )
    collect = (report.get("collect") or {}).get("crafter", {})
    out["collection chunk64 vs stock >= 1.5"] = (
        ratio(collect.get("chunk64"), collect.get("stock")),
        1.5,
    )
    return {
        name: {"ratio": v, "goal": goal, "met": None if None in (v, goal) else v >= goal}
        for name, (v, goal) in out.items()
    }


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary(report: dict) -> str:
    roofs = [r["roof_flops_per_s"] for r in report["learner"].values() if r["roof_flops_per_s"]]
    lines = [
        f"# GPU check: {report['device']}",
        "",
        f"torch {report['torch']}, Python {report['python']}, {report['cores']} cores; "
        f"matmul roof (bf16 on CUDA): {fmt(max(roofs) / 1e12 if roofs else None, 1)} TFLOP/s",
        "",
        "| model | batch | mode | updates/s | replayed steps/s | TFLOP/s | of roof |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, result in report["learner"].items():
        model, size = shape.split("/")
        for mode, r in result["modes"].items():
            share = r.get("roof_share")
            lines.append(
                f"| {model} | {size.replace('x', ' x ')} | {mode} | {fmt(r['updates_per_s'], 3)} | "
                f"{r['replayed_steps_per_s']:.0f} | {fmt(r.get('tflops'), 1)} | "
                f"{'-' if share is None else f'{100 * share:.1f}%'} |"
            )
    t = report.get("trainer") or {}
    lines += [
        "",
        f"trainer (minedojo_4gpu learner, Crafter, world size 1): {t.get('updates', '-')} updates, "
        f"{fmt(t.get('updates_per_s'))} updates/s, {fmt(t.get('env_steps_per_s'), 0)} env steps/s, "
        f"losses finite: {t.get('loss_finite', '-')}",
    ]
    a = report.get("atari") or {}
    lines.append(
        f"atari100k preset (Pong, eager): {a.get('env_steps', '-')} agent steps, "
        f"{a.get('updates', '-')} updates, {fmt(a.get('updates_per_s'))} updates/s, "
        f"losses finite: {a.get('loss_finite', '-')}"
    )
    c = (report.get("collect") or {}).get("crafter", {})
    lines.append(
        "collection (env steps/s): "
        + ", ".join(
            f"{path} {fmt(c.get(path), 0)}" for path in ("limit", "stock", "chunk1", "chunk64")
        )
    )
    lines += ["", "| goal | measured | met |", "|---|---|---|"]
    for name, goal in report["goals"].items():
        lines.append(
            f"| {name} | {fmt(goal['ratio'])} | {goal['met'] if goal['met'] is not None else '-'} |"
        )
    lines += ["", "| step | status | seconds |", "|---|---|---|"]
    for name, row in report["steps"].items():
        lines.append(f"| {name} | {row['status']} (exit {row['exit']}) | {row['seconds']} |")
    return "\n".join(lines) + "\n"


def limit_problems(out: Path) -> list[str]:
    """What in ``out`` would not come back from the GPU machine."""
    problems, files = [], []
    for path in sorted(out.rglob("*")):
        relative = path.relative_to(out)
        if not NAME.match(path.name):
            problems.append(f"{relative}: a name of other characters than letters, digits, . _ -")
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            problems.append(f"{relative}: not a plain file")
        elif path.is_file():
            files.append(path)
            if len(relative.parts) - 1 > MAX_DEPTH:
                problems.append(f"{relative}: more than {MAX_DEPTH} folders down")
            if path.stat().st_size > MAX_BYTES:
                problems.append(f"{relative}: over 16 MiB")
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files, more than {MAX_FILES}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    import torch  # after argparse: --help without torch

    from dreamer.runtime.cores import usable_cores

    cpu = f"cpu ({torch.get_num_threads()} threads)"
    report = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu,
        "dry_run": args.dry_run,
        "command": "bash benchmarks/gpu_check.sh" + (" --dry-run" if args.dry_run else ""),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cores": usable_cores(),
        "steps": steps(args.work),
        "learner": learner(args.work),
        "trainer": trainer(args.work),
        "atari": trainer(args.work, "atari"),
        "collect": read_json(args.work / "collect.json"),
    }
    report["goals"] = goals(report)
    (args.out / "gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    text = summary(report)
    (args.out / "summary.md").write_text(text)
    print(text)
    problems = [
        f"step {n}: {r['status']}" for n, r in report["steps"].items() if r["status"] != "ok"
    ]
    problems += limit_problems(args.out)
    for problem in problems:
        print(f"gpu_check: {problem}")
    print(
        "gpu_check: "
        + ("problems above" if problems else f"all steps ok, {args.out} within the limits")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
