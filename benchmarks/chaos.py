"""SIGKILL random processes of a real training run, then let it finish.

    python benchmarks/chaos.py                          # 20 kills, memory replay, 1 rank
    python benchmarks/chaos.py --kills 5 --replay disk --json results/chaos-disk.json
    python benchmarks/chaos.py --ranks 2 --steps 6000   # torchrun --nproc_per_node=2
    python benchmarks/chaos.py --kills 8 --storage      # storage faults too (root: tmpfs)

Every few seconds a process of the run is killed, its kind drawn among the live kinds
killed least: the driver (the command is then run again and resumes), an env worker, the
inference server, the evaluation process, a render worker (pids from the run's log).
``--storage`` adds ``disk_full`` (the run directory, a tmpfs, fills: the run must stop with
one line and the rerun resume) and ``corrupt_checkpoint`` (a byte of the latest checkpoint
flipped: the rerun must skip it). After each other kill the run must log its recovery
and checkpoint. With no step limit until the last kill's recovery, it is then stopped by
USR1 and a last rerun finishes it at ``--steps`` or ``FINISH`` steps past that checkpoint.
Checked: one metrics row per log interval and evaluation, the restart counters against
the kills, the checkpoint loads, no process left. Exit 0: every kill delivered and the
run survived clean; 1: it did not; 3: the harness could not deliver (``harness_failure``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.procs import (  # noqa: E402
    UNTIL_STOPPED,
    alive,
    command_line,
    descendants,
    fill,
    flip_a_tensor_byte,
    jsonl_rows,
    mount_tmpfs,
)
from dreamer.runtime import checkpoint, signals  # noqa: E402

KINDS = ("driver", "env_worker", "inference", "eval", "render")
STORAGE = ("disk_full", "corrupt_checkpoint")  # faults of the run directory (--storage)
TMPFS = "512m"  # the run directory's size with --storage
# what the run logs once it recovered from a kill of each kind (driver: a rerun)
RECOVERED = {
    "env_worker": r"replacing the collector",
    "inference": r"after its inference server died; replacing the collector",
    "eval": r"the evaluation process.* died",
    "render": r"replacing the render pool",
}
ANNOUNCED = {  # the latest line of each gives the live pids of a kind
    "env_worker": r"env worker pids: ([\d ]+)",
    "inference": r"inference server pid: (\d+)",
    "eval": r"evaluation process pid: (\d+)",
    "render": r"render worker pids: ([\d ]+)",
}
STARTED = r"env worker pids"  # a run is collecting: its children can be drawn
FINISH = 500  # env steps the last rerun trains past the stopped run's checkpoint
DEFAULTS = (  # the smoke run on the cue task, a checkpoint every second, evaluations
    "experiment=smoke env=cue run.train_starts=200 run.train_ratio=4 run.log_every=100 "
    "run.save_every=1 eval.every=500 eval.episodes=1 eval.max_steps=100 "
    "eval.render_workers=1 run.progress=false"
).split()


class ChaosFailed(AssertionError):
    """The run did not survive."""


class HarnessFailed(RuntimeError):
    """The harness could not do what it promised (the run may be fine)."""


def popen(command: list[str], log: Path) -> subprocess.Popen:
    """The command as a process of its own, its output in ``log``."""
    return subprocess.Popen(command, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)


class Attempt:
    """One run of the command, started by ``start`` (``popen``; the suite forks its runs
    from an interpreter that imported the trainer); its output goes to its own log file."""

    def __init__(self, command: list[str], log: Path, start: Callable = popen):
        self.log = log
        self.process = start(command, log)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.text()))

    def wait_for(self, pattern: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.count(pattern) < count:
            if self.process.poll() is not None:
                raise ChaosFailed(f"the run exited waiting for {pattern!r}: {self.tail()}")
            if time.monotonic() > deadline:
                raise ChaosFailed(f"no {pattern!r} in {timeout:.0f} s: {self.tail()}")
            time.sleep(0.2)

    def tail(self) -> str:
        return self.text()[-3000:]


def rank_pids(root: int, ranks: int) -> list[int]:
    """The drivers: the trainer itself, or torchrun's rank processes."""
    if ranks == 1:
        return [root]
    children = set()
    for task in Path(f"/proc/{root}/task").glob("*"):
        try:
            children |= {int(pid) for pid in (task / "children").read_text().split()}
        except OSError:
            pass
    return sorted(children)


def candidates(attempt: Attempt, ranks: int) -> dict[str, list[int]]:
    """Live pids of each kind, from the latest announcements in the log."""
    root = attempt.process.pid
    below = descendants(root)
    found = {"driver": [pid for pid in rank_pids(root, ranks) if alive(pid)]}
    text = attempt.text()
    for kind, pattern in ANNOUNCED.items():
        lines = re.findall(pattern, text)
        pids = [int(pid) for pid in lines[-1].split()] if lines else []
        found[kind] = [pid for pid in pids if pid in below and alive(pid)]
    return {kind: pids for kind, pids in found.items() if pids}


def metrics(logdir: Path) -> list[dict]:
    return jsonl_rows(logdir / "metrics.jsonl")


def last_step(logdir: Path) -> int:
    rows = [row for row in metrics(logdir) if "eval/return" not in row]
    return rows[-1]["env_steps"] if rows else 0


def check_rows(
    rows: list[dict], steps: int, log_every: int, eval_every: int, skipped: list[int] = ()
) -> tuple[int, int]:
    """(duplicated, missing): training rows per log interval must be exactly one, as
    must evaluation rows per evaluation step (but for those the run skipped with a line
    saying so, ``skipped``: the one before still ran, as after an evaluation-process
    kill that replays it), and the final row (at ``steps`` or the loop step past it:
    under torchrun every rank's chunk lands at once) one."""
    train = [row["env_steps"] for row in rows if "eval/return" not in row]
    evals = [row["env_steps"] for row in rows if "eval/return" in row]
    buckets = collections.Counter(step // log_every for step in train if step < steps)
    final = [step for step in train if step >= steps]
    duplicated = sum(n - 1 for n in buckets.values()) + max(len(final) - 1, 0)
    duplicated += sum(n - 1 for n in collections.Counter(evals).values())
    missing = sum(1 for bucket in range(1, steps // log_every) if bucket not in buckets)
    missing += not final
    if eval_every:
        due = {step // eval_every for step in range(eval_every, steps + 1, eval_every)}
        missing += len(due - {step // eval_every for step in [*evals, *skipped]})
    return duplicated, missing


def option(overrides: list[str], key: str, default: str) -> str:
    values = [item.split("=", 1)[1] for item in overrides if item.startswith(f"{key}=")]
    return values[-1] if values else default


def stop(attempt: Attempt, ranks: int, timeout: float) -> None:
    """USR1 to the run's drivers once it is training (a checkpoint written since it
    started or recovered): it checkpoints and exits."""
    attempt.wait_for(r"checkpoint written", attempt.count(r"checkpoint written") + 1, timeout)
    for pid in rank_pids(attempt.process.pid, ranks):
        os.kill(pid, signal.SIGUSR1)
    try:
        attempt.process.wait(timeout)
    except subprocess.TimeoutExpired:
        raise ChaosFailed(f"the run did not stop after USR1: {attempt.tail()}") from None
    if ranks == 1 and attempt.process.returncode != signals.REQUEUE_EXIT:
        raise ChaosFailed(f"USR1 ended the run with {attempt.process.returncode}: {attempt.tail()}")


def stopped_for_a_full_disk(code: int | None, text: str) -> bool:
    """Exit 1 with one error line for whichever write met the full disk first: an output
    (metrics, TensorBoard: "No space left on device") or ``run.save_failures``
    checkpoint writes in a row (a fast run saves several times before its next row)."""
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    return (
        code == 1
        and len(errors) == 1
        and ("No space left" in errors[0] or "checkpoint writes in a row failed" in errors[0])
    )


def judged_end(steps: int, finished: bool, rows: list[dict]) -> int:
    """The env step the rows are checked up to: ``steps`` once the last rerun finished
    the run; else the last training row (a run stopped early by a failure went on past
    ``--steps`` with no step limit, and its rows there are not a duplicated final row)."""
    if finished:
        return steps
    train = [row["env_steps"] for row in rows if "eval/return" not in row]
    return train[-1] if train else 0


def storage_fault(kind: str, attempt: Attempt, logdir: Path, ranks: int, timeout: float) -> str:
    """Deliver ``kind`` to the run of ``attempt``; returns what the next attempt's log
    must show (it then runs the same command)."""
    if kind == "disk_full":
        attempt.wait_for(r"checkpoint written", 1, timeout)  # one to resume from
        filler = fill(logdir)
        try:
            attempt.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ChaosFailed(f"the run did not stop on a full disk: {attempt.tail()}") from None
        filler.unlink()
        if not stopped_for_a_full_disk(attempt.process.returncode, attempt.text()):
            code = attempt.process.returncode
            raise ChaosFailed(f"a full disk ended the run with {code}: {attempt.tail()}")
        return r"resuming from"
    # the fallback must not go back past a recovery: two checkpoints since the last one
    attempt.wait_for(r"checkpoint written", attempt.count(r"checkpoint written") + 2, timeout)
    for pid in rank_pids(attempt.process.pid, ranks):
        os.kill(pid, signal.SIGKILL)
    attempt.process.wait(120)
    newest = checkpoint.latest(logdir)
    flip_a_tensor_byte(newest)
    return rf"skipped {re.escape(newest.name)} .*resuming from"


def chaos(args: argparse.Namespace, start: Callable = popen) -> dict:
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="chaos-"))
    logdir = Path(option(args.overrides, "run.logdir", str(workdir / "run")))
    if args.storage:
        mount_tmpfs(logdir, TMPFS)
    overrides = [*DEFAULTS, f"replay.storage={args.replay}", *args.overrides]
    overrides.append(f"run.logdir={logdir}")
    log_every = int(option(overrides, "run.log_every", "0"))
    eval_every = int(option(overrides, "eval.every", "0"))
    launcher = [sys.executable, "-m", "dreamer.train"]
    if args.ranks > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        launcher += [f"--nproc_per_node={args.ranks}", "-m", "dreamer.train"]
    command = [*launcher, *overrides, UNTIL_STOPPED]  # while kills are delivered
    steps = args.steps  # the end step, fixed once the last kill's recovery is seen
    kills: collections.Counter = collections.Counter()
    eval_kills: list[int] = []  # the last logged env step at each evaluation-process kill
    seen: set[int] = set()
    failure = harness_failure = None
    started = time.monotonic()
    attempts = [Attempt(command, workdir / "attempt0.log", start)]
    print(" ".join(command), flush=True)
    try:
        attempts[-1].wait_for(STARTED, 1, args.timeout)
        last_drawn = time.monotonic()
        while sum(kills.values()) < args.kills:
            attempt = attempts[-1]
            next_kill = time.monotonic() + rng.uniform(*args.interval)
            while time.monotonic() < next_kill and attempt.process.poll() is None:
                seen |= descendants(attempt.process.pid)
                time.sleep(0.2)
            if attempt.process.poll() is not None:
                code = attempt.process.returncode
                raise ChaosFailed(f"the run exited with {code} between kills: {attempt.tail()}")
            alive_now = candidates(attempt, args.ranks)
            if args.storage and alive_now:
                alive_now |= {kind: [0] for kind in STORAGE}
            if args.kinds:
                alive_now = {kind: pids for kind, pids in alive_now.items() if kind in args.kinds}
            if not alive_now:  # between a replacement's start and its announcement
                if time.monotonic() - last_drawn > args.timeout:
                    raise HarnessFailed(f"no process of the run to draw for {args.timeout:.0f} s")
                continue
            last_drawn = time.monotonic()
            # at random among the live kinds killed least so far: a short-lived kind
            # (the evaluation process starts at the first evaluation of each attempt)
            # still gets its share of the kills
            fewest = min(kills[kind] for kind in alive_now)
            kind = rng.choice(sorted(kind for kind in alive_now if kills[kind] == fewest))
            victim = rng.choice(alive_now[kind])
            if kind in STORAGE:
                print(f"{time.monotonic() - started:7.1f} s: {kind}", flush=True)
                expected = storage_fault(kind, attempt, logdir, args.ranks, args.timeout)
                kills[kind] += 1
                attempts.append(Attempt(command, workdir / f"attempt{len(attempts)}.log", start))
                attempts[-1].wait_for(expected, 1, args.timeout)
                attempts[-1].wait_for(STARTED, 1, args.timeout)
                continue
            seen |= descendants(attempt.process.pid)
            before = {name: attempt.count(pattern) for name, pattern in RECOVERED.items()}
            saved = attempt.count(r"checkpoint written")
            if kind == "eval":
                eval_kills.append(last_step(logdir))
            signal_time = time.monotonic() - started
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:  # it exited meanwhile: draw again
                continue
            kills[kind] += 1
            print(f"{signal_time:7.1f} s: killed {kind} {victim}", flush=True)
            if kind == "driver":
                try:
                    attempt.process.wait(120)
                except subprocess.TimeoutExpired:
                    raise ChaosFailed("the run did not exit after its driver was killed") from None
                attempts.append(Attempt(command, workdir / f"attempt{len(attempts)}.log", start))
                attempts[-1].wait_for(STARTED, 1, args.timeout)
                continue
            attempt.wait_for(RECOVERED[kind], before[kind] + 1, args.timeout)
            after = attempt.count(r"checkpoint written")
            attempt.wait_for(r"checkpoint written", max(after, saved) + 1, args.timeout)
        # every kill delivered and recovered from: stop the run, then finish it
        stop(attempts[-1], args.ranks, args.timeout)
        stopped_at = checkpoint.load(checkpoint.latest(logdir))["steps"]["env_steps"]
        steps = max(args.steps, stopped_at + FINISH)
        final = [*command[:-1], f"run.steps={steps}"]
        attempts.append(Attempt(final, workdir / f"attempt{len(attempts)}.log", start))
        while attempts[-1].process.poll() is None:
            seen |= descendants(attempts[-1].process.pid)
            time.sleep(0.2)
        if attempts[-1].process.returncode != 0:
            raise ChaosFailed(
                f"the last rerun exited with {attempts[-1].process.returncode}: "
                f"{attempts[-1].tail()}"
            )
    except ChaosFailed as error:
        failure = str(error)
    except HarnessFailed as error:
        harness_failure = str(error)
    finally:
        for attempt in attempts:
            if attempt.process.poll() is None:
                seen |= descendants(attempt.process.pid)
                attempt.process.kill()
                attempt.process.wait(60)
        (logdir / "filler").unlink(missing_ok=True)
    wall = time.monotonic() - started
    deadline = time.monotonic() + 30
    while any(map(alive, seen)) and time.monotonic() < deadline:
        time.sleep(0.5)
    orphans = sorted(pid for pid in seen if alive(pid))
    rows = metrics(logdir)
    skipped = [
        int(step)
        for attempt in attempts
        for step in re.findall(r"eval at env step (\d+) skipped", attempt.text())
    ]
    finished = failure is None and harness_failure is None
    end = judged_end(steps, finished, rows)
    duplicated, missing = check_rows(rows, end, log_every, eval_every, skipped)
    checks: dict[str, object] = {}
    train = [row for row in rows if "eval/return" not in row]
    last = train[-1] if train else {}
    checks["reached_steps"] = last.get("env_steps", 0) >= steps
    try:
        state = checkpoint.load(checkpoint.latest(logdir))
        checks["checkpoint_loads"] = state["steps"]["env_steps"] == last.get("env_steps")
    except Exception as error:  # noqa: BLE001 - reported, not raised
        checks["checkpoint_loads"] = f"{type(error).__name__}: {error}"
    counters = {
        "env/restarts": kills["env_worker"] + kills["inference"],
        "restarts/inference": kills["inference"],
        "restarts/eval": kills["eval"],
        "restarts/render": kills["render"],
    }
    checks["counters"] = {key: [last.get(key), want] for key, want in counters.items()}
    counters_match = all(got == want for got, want in checks["counters"].values())
    evals = [row["env_steps"] for row in rows if "eval/return" in row]
    checks["eval_rows_after_eval_kills"] = all(
        any(step >= at - at % eval_every for step in evals) for at in eval_kills
    )
    survived = (
        failure is None
        and checks["reached_steps"] is True
        and checks["checkpoint_loads"] is True
        and counters_match
        and checks["eval_rows_after_eval_kills"]
    )
    if args.storage:  # what the run left, kept for inspection, then the mount goes
        subprocess.run(["cp", "-a", str(logdir), str(workdir / "run-files")], check=False)
        subprocess.run(["umount", "-l", str(logdir)], check=False)
    return {
        "kills": {kind: kills[kind] for kind in KINDS},
        "faults": {kind: kills[kind] for kind in STORAGE} if args.storage else {},
        "delivered": sum(kills.values()) == args.kills,
        "harness_failure": harness_failure,
        "survived": survived,
        "duplicated_rows": duplicated,
        "missing_rows": missing,
        "orphans": len(orphans),
        "orphan_commands": [command_line(pid) for pid in orphans],
        "skipped_evals": skipped,
        "wall_s": round(wall, 1),
        "reruns": len(attempts) - 1,
        "checks": checks,
        "failure": failure,
        "command": " ".join(command),
        "logs": str(workdir),
    }


def main(argv: list[str] | None = None, start: Callable = popen) -> int:
    """``start``: how each attempt's command starts (``popen``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--replay", choices=("memory", "disk"), default="memory")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--storage", action="store_true", help="disk_full, corrupt_checkpoint")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, help="the least end step (250 per kill + 1000)")
    parser.add_argument("--kinds", nargs="+", choices=(*KINDS, *STORAGE), help="draw only these")
    parser.add_argument("--interval", type=float, nargs=2, default=(2.0, 6.0))
    parser.add_argument("--timeout", type=float, default=300, help="s to wait for a recovery")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.kinds and set(args.kinds) & set(STORAGE) and not args.storage:
        parser.error("--kinds: disk_full and corrupt_checkpoint need --storage")
    if args.steps is None:
        args.steps = 250 * args.kills + 1000
    result = chaos(args, start)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    clean = result["survived"] and not (
        result["duplicated_rows"] or result["missing_rows"] or result["orphans"]
    )
    if result["harness_failure"] or not result["delivered"]:
        return 3
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
