"""Data-parallel learner updates under torchrun, for tests/test_distributed.py.

    torchrun --nproc_per_node=R -m tests.ddp_updates OUT --batch B --updates N [--same-draws]

Every process builds the same tiny CartPole agent and the same N batches of R x B
sequences from the real env; rank r trains on rows [r*B, (r+1)*B) of each through the
project's Learner (gradients averaged over the ranks), then writes OUT/rank<r>.pt
(its weights and buffers) and, rank 0, OUT/initial.pt (the weights before training).

``--same-draws`` replaces the learner's random draws (latent and action samples) by
fixed ones, so rows get the same draws however the batch is split across ranks: that
is what lets R ranks x B rows be compared with one rank x R*B rows.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch

from dreamer.agent.build import build_agent
from dreamer.command_line import load
from dreamer.learning.learner import Learner
from dreamer.runtime.dist import process_group
from dreamer.runtime.world import World
from tests.batches import real_batch


@contextlib.contextmanager
def same_draws():
    """torch's samplers as fixed functions of their inputs: uniforms are 0.5, a
    categorical draw is the most likely choice."""
    saved = torch.rand, torch.multinomial

    def rand(*size, dtype=None, device=None, **_):
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return torch.full(tuple(shape), 0.5, dtype=dtype, device=device)

    def multinomial(probs, num_samples, replacement=False, **_):
        return probs.argmax(-1, keepdim=True).expand(*probs.shape[:-1], num_samples)

    torch.rand, torch.multinomial = rand, multinomial
    try:
        yield
    finally:
        torch.rand, torch.multinomial = saved


def main(argv: list[str] | None = None) -> None:
    """Without torchrun (no ``RANK``): one process, no process group."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch", type=int, required=True, help="rows per rank")
    parser.add_argument("--updates", type=int, required=True)
    parser.add_argument("--same-draws", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, a GPU a rank)")
    args = parser.parse_args(argv)
    world = World.from_environment()
    cfg = load(["experiment=smoke", "env=cartpole"])
    batches = []
    for update in range(args.updates):
        spaces, batch = real_batch(cfg, world.size * args.batch, cfg.replay.length, seed=update)
        batches.append(batch[world.rank * args.batch : (world.rank + 1) * args.batch])
    device = world.device(args.device)
    with process_group(world, device, timeout_s=120):
        torch.manual_seed(0)
        learner = Learner(build_agent(cfg.model, cfg.learner, spaces), cfg.learner, device, world)
        args.out.mkdir(parents=True, exist_ok=True)
        if world.main:
            torch.save(learner.loss.state_dict(), args.out / "initial.pt")
        torch.manual_seed(1)
        with same_draws() if args.same_draws else contextlib.nullcontext():
            for batch in batches:
                learner.update(batch)
        state = {"loss": learner.loss.state_dict(), "batch": batches[0]["action"]}
        state = torch.utils._pytree.tree_map(lambda t: t.cpu(), state)
        torch.save(state, args.out / f"rank{world.rank}.pt")


if __name__ == "__main__":
    main()
