"""One learner update of the smoke agent in a process of its own, written to ``out``:
its losses, its gradients, how long the first update took (compiling included) and
what inductor's compile cache counted (hits: graphs loaded, misses: graphs compiled).

    python -m tests.compiled_update OUT [overrides...]
"""

import sys
import time
from pathlib import Path

import torch

from dreamer.agent.build import build_agent
from dreamer.command_line import load
from dreamer.data.replay import random_batch
from dreamer.learning.learner import Learner
from tests.batches import MULTI_KEY

BASE = ["experiment=smoke"]


def one_update(overrides: list[str]) -> dict:
    cfg = load([*BASE, *overrides])
    batch = random_batch(MULTI_KEY, cfg.replay.batch, cfg.replay.length)
    torch.manual_seed(0)
    agent = build_agent(cfg.model, cfg.learner, MULTI_KEY)
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
