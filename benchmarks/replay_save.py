"""What one checkpoint save costs as the replay fills: seconds, bytes, memory, disk.

    python benchmarks/replay_save.py                       # replay.size 1,000,000
    python benchmarks/replay_save.py --fills 0,10000 --storage memory --json /tmp/r.json

Crafter-shaped transitions go into the replay in collector-sized writes up to each of
``--fills``; there a checkpoint is saved as the trainer saves it (``checkpoint.Saver``,
no weights). Each storage in a fresh process; per fill the save's seconds (the replay's
share), the bytes it and the filling wrote, resident memory and the run dir's blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.procs import cpu_model  # noqa: E402

KEYS = ["action", "is_init", ("next", "image"), ("next", "reward"), ("next", "done")]
KEYS.append(("next", "terminated"))
ACTIONS = 17
POOL = 1024  # distinct random frames, cycled


def written_bytes() -> int:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["wchar"])


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def one_storage(storage: str, args: argparse.Namespace, fills: list[int]) -> None:
    """Runs in its own process: fill, save at each fill, one JSON line per fill."""
    import torch
    from tensordict import TensorDict
    from torch.nn import functional

    from dreamer.data.replay import SequenceReplay
    from dreamer.runtime import checkpoint

    torch.manual_seed(0)
    frames = torch.randint(0, 256, (POOL, 64, 64, 3), dtype=torch.uint8)
    with tempfile.TemporaryDirectory(dir=os.environ.get("REPLAY_SAVE_DIR")) as folder:
        logdir = Path(folder)
        replay = SequenceReplay(
            args.size, args.envs, 16, 64, KEYS, storage=storage,
            directory=logdir / "replay", heads=(ACTIONS,),
        )  # fmt: skip
        registry = checkpoint.Registry()
        registry.register("replay", replay)
        extras = {"learner": {}, "config": {}, "steps": {"env_steps": 0}}
        save = checkpoint.Saver(logdir, registry, extras, keep=args.keep, failures=1)
        state_dict, share = replay.state_dict, {}

        def timed_state_dict():
            started = time.perf_counter()
            state = state_dict()
            share["s"] = time.perf_counter() - started
            return state

        replay.state_dict = timed_state_dict
        done = 0
        for fill in fills:
            fill_bytes = written_bytes()
            while done < fill:
                rows = min(args.chunk * args.envs, fill - done)
                index = torch.arange(done, done + rows)
                no = torch.zeros(rows, 1, dtype=torch.bool)
                nxt = {"image": frames[index % POOL], "reward": torch.ones(rows, 1)}
                nxt |= {"done": no, "terminated": no}
                data = {"env_index": index % args.envs, "is_init": (index % 1000 == 0)[:, None]}
                data |= {"action": functional.one_hot(index % ACTIONS, ACTIONS), "next": nxt}
                replay.extend(TensorDict(data, [rows]))
                done += rows
            fill_bytes = written_bytes() - fill_bytes
            save.extras["steps"] = {"env_steps": fill}
            started, before = time.perf_counter(), written_bytes()
            assert save(fill), "the save failed"
            save_s = time.perf_counter() - started
            row = {"storage": storage, "fill": fill, "save_s": round(save_s, 3)}
            row |= {"replay_share_s": round(share["s"], 3)}
            row |= {"checkpoint_write_s": round(save_s - share["s"], 3)}
            row |= {"save_bytes": written_bytes() - before, "fill_bytes": fill_bytes}
            row |= {"checkpoint_bytes": checkpoint.latest(logdir).stat().st_size}
            row |= {"rss_mb": round(resident_mb())}
            blocks = sum(p.stat().st_blocks * 512 for p in logdir.rglob("*") if p.is_file())
            print(json.dumps(row | {"run_dir_bytes": blocks}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=64, help="transitions per stream per write")
    parser.add_argument("--fills", default="0,10000,50000,100000,200000")
    parser.add_argument("--keep", type=int, default=3, help="run.keep")
    parser.add_argument("--storage", default="memory,disk")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/replay_save.json"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the storage, in the child
    args = parser.parse_args()
    fills = [int(fill) for fill in args.fills.split(",")]
    if args.one:
        return one_storage(args.one, args, fills)
    rows = []
    for storage in args.storage.split(","):
        command = [sys.executable, __file__, "--one", storage, *sys.argv[1:]]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        print(done.stdout, end="", flush=True)
        rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode:
            raise SystemExit(f"{storage}: exit {done.returncode}\n{done.stderr[-3000:]}")
    result = {
        "command": "python benchmarks/replay_save.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "size": args.size,
        "envs": args.envs,
        "keep": args.keep,
        "rows": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
