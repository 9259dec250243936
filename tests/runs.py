"""Running the real trainer from tests, and reading what it wrote."""

import json
import subprocess
import sys
from pathlib import Path


def run_trainer(
    logdir: Path, *overrides: str, timeout: float = 600, preexec_fn=None
) -> subprocess.CompletedProcess:
    """``python -m dreamer.train`` in a subprocess, without the progress bar."""
    command = [
        sys.executable,
        "-m",
        "dreamer.train",
        *overrides,
        f"run.logdir={logdir}",
        "run.progress=false",
    ]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn
    )


def read_metrics(logdir: Path, which: str = "train") -> list[dict]:
    """metrics.jsonl's training rows, its evaluation rows (``which="eval"``) or all."""
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    if which == "all":
        return rows
    return [row for row in rows if ("eval/return" in row) == (which == "eval")]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (Linux /proc)."""
    found, queue = set(), [pid]
    while queue:
        for task in Path(f"/proc/{queue.pop()}/task").glob("*"):
            try:
                children = {int(child) for child in (task / "children").read_text().split()}
            except OSError:  # it exited meanwhile
                continue
            queue += children - found
            found |= children
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"
