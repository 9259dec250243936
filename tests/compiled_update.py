"""One learner update of the smoke agent on the cue env's spaces (the suite's trainer runs'
agent: a run of ``experiment=smoke env=cue`` compiles the same graphs) in a process of its
own, written to ``out``: its losses, its gradients, how long the first update took
(compiling included) and what inductor's compile cache counted (hits: graphs loaded,
misses: graphs compiled).

    python -m tests.compiled_update OUT [overrides...]
"""

import sys
import time
from pathlib import Path

import torch

from dreamer.agent.build import build_agent
from dreamer.command_line import load
from dreamer.learning.learner import Learner
from tests.batches import real_batch

BASE = ["experiment=smoke", "env=cue"]


def one_update(overrides: list[str]) -> dict:
    cfg = load([*BASE, *overrides])
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    torch.manual_seed(0)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    learner = Learner(agent, cfg.learner, torch.device("cpu"))
    torch.manual_seed(1)
    started = time.perf_counter()
    losses = learner.update(batch)
    seconds = time.perf_counter() - started
    grads = {name: p.grad.clone() for name, p in learner.loss.named_parameters()}
    from torch._dynamo.utils import counters  # the compile caches' own hits and misses

    cache = {key: int(value) for key, value in counters["inductor"].items() if "cache" in key}
    return {"losses": losses, "grads": grads, "seconds": seconds, "cache": cache}


if __name__ == "__main__":
    torch.save(one_update(sys.argv[2:]), Path(sys.argv[1]))
