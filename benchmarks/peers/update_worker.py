"""The JSON-lines loop shared by the workers of ``update.py`` (standard library only: it
runs under every implementation's own Python).

A worker reads one JSON object per line on stdin, ``{"cmd": NAME, ...arguments}``, and
answers one JSON object per line on stdout: ``{"ok": true, ...result}`` or
``{"ok": false, "error": "..."}``. Commands: ``build`` (keyword arguments of the
implementation's ``build``), ``update`` (one update, timed inside the worker: wall and
CPU seconds), ``flops`` (FLOPs of one update) and ``quit``. Whatever the libraries print
goes to stderr: the worker's stdout carries the answers alone.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def thread_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process so far (Linux; empty elsewhere)."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            out[int(task)] = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    except (OSError, IndexError, ValueError):
        return {}
    return out


def timed(update) -> dict:
    """Wall and CPU seconds of ``update()`` (CPU time of every thread of the process: the
    ratio shows how many cores it kept busy) and how many threads computed: those with
    at least a tenth of its CPU time (a count that background load does not change)."""
    threads = thread_cpu()
    wall, cpu = time.perf_counter(), time.process_time()
    update()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    used = sorted((t - threads.get(tid, 0.0) for tid, t in thread_cpu().items()), reverse=True)
    busy = sum(u >= 0.1 * max(cpu, 1e-9) for u in used)
    return {"s": wall, "cpu_s": cpu, "busy_threads": busy, "thread_cpu_s": used[:4]}


def serve(worker) -> int:
    """Answer commands with ``worker``'s methods (``build``, ``update``, ``flops``) until
    ``quit`` or the end of stdin."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # banners and progress prints of the libraries: to stderr
    for line in sys.stdin:
        message = json.loads(line)
        command = message.pop("cmd")
        if command == "quit":
            answers.write(json.dumps({"ok": True}) + "\n")
            break
        try:
            result = getattr(worker, command)(**message)
            answer = {"ok": True, **result}
        except Exception as error:  # reported to the driver, which carries on without it
            traceback.print_exc()
            answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        answers.write(json.dumps(answer) + "\n")
    return 0


def torch_flop_counter():
    """``benchmarks/flop_count.py``'s FlopCount (torch alone), for the torch workers."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from flop_count import FlopCount

    return FlopCount()


def unique_params(*modules) -> int:
    """Parameters of torch ``modules``, each counted once even where they share some."""
    seen = {id(p): p.numel() for module in modules for p in module.parameters()}
    return sum(seen.values())


def conv_layers(module) -> list[str]:
    """The convolutions of a torch ``module`` and its pooling: channels, kernel, stride."""
    from torch import nn

    layers = []
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            layers.append(
                f"{type(m).__name__} {m.in_channels}->{m.out_channels} "
                f"k{m.kernel_size[0]} s{m.stride[0]}"
            )
        elif type(m).__name__.endswith(("Pool", "Pool2d", "Upsample")):
            layers.append(type(m).__name__)
    return layers
