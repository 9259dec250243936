"""The JSON-lines loop of ``update.py``'s workers (standard library only: it runs under
every implementation's own Python). A worker reads ``{"cmd": NAME, ...arguments}`` lines
on stdin (``build``, ``update``, ``flops``, ``quit``) and answers ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}`` lines on stdout; what the libraries print goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def timed(update) -> dict:
    """Wall and CPU seconds of ``update()`` (CPU time of every thread of the process: the
    ratio shows how many cores it kept busy, which the driver's CPU affinity bounds)."""
    wall, cpu = time.perf_counter(), time.process_time()
    update()
    return {"s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


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
    """FLOPs of what runs under it (``.total``), by torch's own formulas (matmuls,
    convolutions, attention) over every op dispatched; torch's ``FlopCounterMode``
    cannot track modules that take tensordicts. ``benchmarks/learner.py`` uses it too."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class FlopCount(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            formula = flop_registry.get(func._overloadpacket)
            if formula is not None:
                self.total += formula(*args, **(kwargs or {}), out_val=out)
            return out

    return FlopCount()


def unique_params(*modules) -> int:
    """Parameters of torch ``modules``, each counted once even where they share some."""
    seen = {id(p): p.numel() for module in modules for p in module.parameters()}
    return sum(seen.values())
