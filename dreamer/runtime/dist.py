"""Data-parallel training with ``torch.distributed``: the process group, one gradient
all-reduce per update and the loop's lockstep. torchrl's ``DreamerV3OptimizationStepper``
refuses distributed execution, so ``AveragingSkippingOptimizer.step`` calls
:class:`GradientAverager`, outside the CUDA-graph captured forward/backward (no
collective in a graph). Launch with ``torchrun``, or with ``srun`` alone when the batch
script exports ``MASTER_ADDR``/``MASTER_PORT``."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as tdist

from dreamer.runtime.world import World


@contextlib.contextmanager
def process_group(world: World, device: torch.device, timeout_s: float) -> Iterator[None]:
    """The default process group (NCCL on CUDA, gloo on the CPU); ``timeout_s`` bounds
    every collective, so a rank whose peer died or hangs raises instead of waiting."""
    if not world.distributed:
        yield
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tdist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=world.rank,
        world_size=world.size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        yield
    finally:
        tdist.destroy_process_group()


class GradientAverager:
    """The mean over the ranks of every gradient and of ``extras`` (e.g. the return
    normalisation statistics), as one bucketed all-reduce per dtype and device."""

    def __init__(self, world: World, extras: Iterable[torch.Tensor] = ()):
        self.world = world
        self.extras = list(extras)

    def __call__(self, tensors: list[torch.Tensor]) -> None:
        buckets: dict[tuple, list[torch.Tensor]] = {}
        for tensor in [*tensors, *self.extras]:
            buckets.setdefault((tensor.device, tensor.dtype), []).append(tensor)
        for bucket in buckets.values():
            flat = torch.cat([tensor.reshape(-1) for tensor in bucket])
            tdist.all_reduce(flat)
            flat /= self.world.size
            parts = flat.split([tensor.numel() for tensor in bucket])
            torch._foreach_copy_(bucket, [p.view_as(t) for p, t in zip(parts, bucket)])


class Lockstep:
    """The loop's decisions, taken by all ranks together by one all-reduce per iteration
    (so all run the same updates and leave the loop together), and ``env_steps``: all
    ranks' steps over resumes, the one count the schedules, logs and checkpoints use."""

    def __init__(self, world: World, device: torch.device):
        self.world = world
        self.device = device
        self.env_steps = 0  # all ranks' steps, as of the last call (or the checkpoint)
        self._base = 0  # env_steps when this process started (or resumed)

    def __call__(self, worker_steps: int, stop: bool, ready: bool) -> tuple[int, bool, bool]:
        """(env steps of all ranks, any rank stopping, every rank's replay ready), from
        this rank's ``worker_steps`` since it started."""
        mine = worker_steps
        if self.world.distributed:
            totals = torch.tensor(
                [mine, float(stop), float(not ready)], dtype=torch.float64, device=self.device
            )
            tdist.all_reduce(totals)
            mine, stop, ready = int(totals[0]), bool(totals[1]), not bool(totals[2])
        self.env_steps = self._base + mine
        return self.env_steps, stop, ready

    def state_dict(self) -> dict:
        return {"env_steps": self.env_steps}

    def load_state_dict(self, state: dict) -> None:
        self.env_steps = self._base = state["env_steps"]
