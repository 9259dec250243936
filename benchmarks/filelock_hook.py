"""Does importing filelock slow the driver's receive path?

    python benchmarks/filelock_hook.py [--messages 1000] [--other-python /path/to/python3.12]

filelock >= 3.30 installs a ``sys.addaudithook`` hook at import on CPython >= 3.12; an
audit hook runs on every audit event, and unpickling raises one per class it looks up
(``pickle.find_class``), others for the shared-memory file descriptors it receives.

1. On this interpreter: a real chunk message (64 consecutive Crafter transitions, as
   torchrl's env worker consolidates and puts it) is sent N times through a
   ``multiprocessing.Queue`` by a child process, in rounds that are queued before the
   receiver times its ``get()`` calls; timed in a fresh process without filelock
   imported and in one with it; a third run counts the audit events per receive.
2. With ``--other-python`` (a CPython >= 3.12 with filelock installed): the cost of one
   audit event with and without filelock's hook, so the per-message cost there is
   events per message x extra cost per event.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 64
ROUND = 32  # messages queued before the receiver times getting them
FILL_SECONDS = 0.5

EVENT_COST = """
import sys, time
if sys.argv[1] == "filelock":
    import filelock  # noqa: F401
n = 200_000
started = time.perf_counter()
for _ in range(n):
    sys.audit("pickle.find_class", "torch", "Tensor")
print((time.perf_counter() - started) / n)
"""


def chunk_message():
    sys.path.insert(0, str(ROOT))
    import torch
    from omegaconf import OmegaConf

    from dreamer.agent.build import latent_sizes
    from dreamer.config import load
    from dreamer.envs.make import make_env

    cfg = load(["env=crafter", "model=size1m"])
    latent = latent_sizes(cfg.model)
    env = make_env(OmegaConf.to_container(cfg.env), 0, latent)
    rollout = env.rollout(CHUNK, break_when_any_done=False)
    env.close()
    rollout.set("env_index", torch.zeros(CHUNK, dtype=torch.long))
    return rollout.consolidate()


def _send(queue, acks, rounds: int) -> None:
    """Like torchrl's env worker: a fresh consolidated chunk per message (its shared
    storage kept alive until received); ``ROUND`` messages, then wait for the receiver."""
    message = chunk_message()
    for _ in range(rounds):
        alive = [message.clone().consolidate() for _ in range(ROUND)]
        for chunk in alive:
            queue.put(chunk)
        acks.get()


def receive(mode: str, count: int) -> dict:
    """In a fresh process: seconds per received message (``get()`` of a message that is
    already waiting, so the sender's pace is not measured), or audit events per message."""
    import multiprocessing

    if mode == "filelock":
        import filelock  # noqa: F401
    else:
        assert "filelock" not in sys.modules
    events: dict[str, int] = {}
    if mode == "count":

        def hook(event, _args):
            events[event] = events.get(event, 0) + 1

        sys.addaudithook(hook)  # last: it cannot be removed
    context = multiprocessing.get_context("spawn")
    queue, acks = context.Queue(), context.Queue()
    rounds = 1 + max(1, count // ROUND)
    sender = context.Process(target=_send, args=(queue, acks, rounds))
    sender.start()
    seconds, received = 0.0, 0
    for round_ in range(rounds):
        time.sleep(FILL_SECONDS)  # the sender fills the queue
        if round_ == 1 and mode == "count":
            events.clear()  # the first round pays one-time costs
        started = time.perf_counter()
        messages = [queue.get() for _ in range(ROUND)]
        if round_ >= 1:
            seconds += time.perf_counter() - started
            received += ROUND
        del messages
        acks.put(True)
    sender.join()
    result = {"seconds_per_message": seconds / received, "messages": received}
    if mode == "count":
        result["events_per_message"] = {k: v / received for k, v in sorted(events.items())}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--other-python", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--mode", choices=["plain", "filelock", "count"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(receive(args.mode, args.messages)))
        return 0
    results = {"python": sys.version.split()[0]}
    for mode in ("plain", "filelock", "count"):
        command = [sys.executable, __file__, "--mode", mode, "--messages", str(args.messages)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    plain = results["plain"]["seconds_per_message"]
    with_filelock = results["filelock"]["seconds_per_message"]
    events = results["count"]["events_per_message"]
    print(f"Python {results['python']}: {CHUNK}-transition Crafter chunk, {args.messages} messages")
    print(f"  receive without filelock: {1e6 * plain:.1f} us/message")
    print(
        f"  receive with filelock:    {1e6 * with_filelock:.1f} us/message "
        f"({with_filelock / plain:.2f}x)"
    )
    print(f"  audit events per message: {sum(events.values()):.1f} ({events})")
    if args.other_python:
        costs = {}
        for mode in ("plain", "filelock"):
            done = subprocess.run(
                [str(args.other_python), "-c", EVENT_COST, mode],
                capture_output=True,
                text=True,
                check=True,
            )
            costs[mode] = float(done.stdout.strip())
        version = subprocess.run(
            [
                str(args.other_python),
                "-c",
                "import sys, filelock; print(sys.version.split()[0], filelock.__version__)",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        extra = (costs["filelock"] - costs["plain"]) * sum(events.values())
        results["other_python"] = {
            "python": version[0],
            "filelock": version[1],
            "seconds_per_event": costs,
            "extra_seconds_per_message": extra,
        }
        print(
            f"Python {version[0]}, filelock {version[1]}: one audit event costs "
            f"{1e9 * costs['plain']:.0f} ns without filelock, "
            f"{1e9 * costs['filelock']:.0f} ns with its hook"
        )
        print(
            f"  => about {1e6 * extra:.2f} us more per received message "
            f"({100 * extra / plain:.1f}% of a receive here), "
            f"{1e6 * extra / CHUNK:.3f} us per transition"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
