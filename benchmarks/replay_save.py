"""One checkpoint save as the replay fills: the layout before issue 37 against today's.

    python benchmarks/replay_save.py                       # replay.size 1,000,000
    python benchmarks/replay_save.py --fills 0,10000 --storage memory --json /tmp/r.json

Crafter-shaped transitions (a 64 x 64 x 3 uint8 image, 17 discrete actions one-hot as
the collector delivers them, is_init, reward, done, terminated) go into a replay of
``--size`` transitions over ``--envs`` streams in collector-sized chunks (``--chunk``
per stream), up to each ``--fills`` total; at each one a checkpoint is saved as the
trainer saves it (``checkpoint.Saver``: the replay's share, then the atomic, checksummed
checkpoint write; ``--keep`` as ``run.keep``, 3). The layouts, each in a fresh process:
``old``, the replay of checkpoint format 1 (``tests/legacy_replay.py``, main's code before issue 37:
torchrl storages of the whole capacity, a memory checkpoint holding all of it) and
``new`` (``dreamer.data.replay``). Per save: its seconds (the replay's share, the
checkpoint write), bytes it wrote (``write()`` calls, /proc/self/io), the checkpoint's
size; per fill: the seconds and bytes the filling wrote in the loop (new: the chunks as
they complete), resident memory, and the run directory's allocated disk blocks. The
learner's weights and optimizer are not in these checkpoints: they add the same to
both layouts.

Writes ``--json`` (default ``benchmarks/results/replay_save.json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def allocated(folder: Path) -> int:
    """Disk blocks allocated under ``folder`` (a preallocated file counts in full)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def one_layout(
    layout: str, storage: str, size: int, envs: int, chunk: int, fills: list[int], keep: int
):
    """Runs in its own process: fill, save at each fill, report (JSON lines)."""
    import torch
    from tensordict import TensorDict
    from torch.nn import functional

    from dreamer.runtime import checkpoint

    torch.manual_seed(0)
    frames = torch.randint(0, 256, (POOL, 64, 64, 3), dtype=torch.uint8)
    with tempfile.TemporaryDirectory(dir=os.environ.get("REPLAY_SAVE_DIR")) as folder:
        logdir = Path(folder)
        if layout == "old":
            from tests.legacy_replay import LegacyReplay

            replay = LegacyReplay(
                size, envs, 16, 64, KEYS, storage=storage, directory=logdir / "replay"
            )
        else:
            from dreamer.data.replay import SequenceReplay

            replay = SequenceReplay(
                size,
                envs,
                16,
                64,
                KEYS,
                storage=storage,
                directory=logdir / "replay",
                heads=(ACTIONS,),
            )
        registry = checkpoint.Registry()
        registry.register("replay", replay)
        extras = {"learner": {}, "config": {}, "steps": {"env_steps": 0}}
        save = checkpoint.Saver(logdir, registry, extras, keep=keep, failures=1)
        state_dict = replay.state_dict
        share = {}

        def timed_state_dict():
            started = time.perf_counter()
            state = state_dict()
            share["s"] = time.perf_counter() - started
            return state

        replay.state_dict = timed_state_dict
        done = 0
        for fill in fills:
            fill_started, fill_bytes = time.perf_counter(), written_bytes()
            while done < fill:
                rows = min(chunk * envs, fill - done)
                index = torch.arange(done, done + rows)
                action = functional.one_hot(index % ACTIONS, ACTIONS)
                data = TensorDict(
                    {
                        "env_index": index % envs,
                        "action": action,
                        "is_init": (index % 1000 == 0).unsqueeze(-1),
                        "next": {
                            "image": frames[index % POOL],
                            "reward": torch.ones(rows, 1),
                            "done": torch.zeros(rows, 1, dtype=torch.bool),
                            "terminated": torch.zeros(rows, 1, dtype=torch.bool),
                        },
                    },
                    [rows],
                )
                replay.extend(data)
                done += rows
            fill_s = time.perf_counter() - fill_started
            fill_bytes = written_bytes() - fill_bytes
            save.extras["steps"] = {"env_steps": fill}
            started, before = time.perf_counter(), written_bytes()
            assert save(fill), "the save failed"
            save_s = time.perf_counter() - started
            save_bytes = written_bytes() - before
            path = checkpoint.latest(logdir)
            row = {
                "layout": layout,
                "storage": storage,
                "fill": fill,
                "save_s": round(save_s, 3),
                "replay_share_s": round(share["s"], 3),
                "checkpoint_write_s": round(save_s - share["s"], 3),
                "save_bytes": save_bytes,
                "checkpoint_bytes": path.stat().st_size,
                "fill_s": round(fill_s, 2),
                "fill_bytes": fill_bytes,
                "rss_mb": round(resident_mb()),
                "run_dir_bytes": allocated(logdir),
            }
            print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=64, help="transitions per stream per write")
    parser.add_argument("--fills", default="0,10000,50000,100000,200000")
    parser.add_argument("--keep", type=int, default=3, help="run.keep")
    parser.add_argument("--layouts", default="old,new")
    parser.add_argument("--storage", default="memory,disk")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/replay_save.json"))
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # layout storage (child)
    args = parser.parse_args()
    fills = [int(fill) for fill in args.fills.split(",")]
    if args.one:
        one_layout(*args.one, args.size, args.envs, args.chunk, fills, args.keep)
        return
    rows = []
    for storage in args.storage.split(","):
        for layout in args.layouts.split(","):
            command = [sys.executable, __file__, "--one", layout, storage, *sys.argv[1:]]
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            rows += [json.loads(line) for line in lines]
            if done.returncode:
                print(done.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{layout} {storage}: exit {done.returncode}")
    print(
        f"{'layout':6} {'storage':7} {'fill':>8} {'save s':>7} {'replay s':>8} "
        f"{'write s':>7} {'MB/save':>9} {'ckpt MB':>8} {'fill s':>7} {'fill MB':>8} "
        f"{'RSS MB':>7} {'disk MB':>8}"
    )
    for row in rows:
        print(
            f"{row['layout']:6} {row['storage']:7} {row['fill']:>8,} {row['save_s']:>7.3f} "
            f"{row['replay_share_s']:>8.3f} {row['checkpoint_write_s']:>7.3f} "
            f"{row['save_bytes'] / 1e6:>9,.1f} {row['checkpoint_bytes'] / 1e6:>8,.1f} "
            f"{row['fill_s']:>7.2f} {row['fill_bytes'] / 1e6:>8,.1f} {row['rss_mb']:>7,} "
            f"{row['run_dir_bytes'] / 1e6:>8,.0f}"
        )
    result = {
        "command": "python benchmarks/replay_save.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "size": args.size,
        "envs": args.envs,
        "keep": args.keep,
        "rows": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
