"""Which rank of a data-parallel job this process is (``dreamer.runtime.dist``), and the
collectives the loop's set-up uses. Read before torch is imported (the config's checks
take the world size): torch comes with the first call that needs it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that logs, evaluates and checkpoints."""
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> World:
        env = os.environ
        if "WORLD_SIZE" in env:  # torchrun (or any launcher speaking its protocol)
            return cls(
                int(env.get("RANK", "0")), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))
            )
        if int(env.get("SLURM_NTASKS", "1")) > 1 and "MASTER_ADDR" in env:  # srun, no torchrun
            local = int(env.get("SLURM_LOCALID", "0"))
            return cls(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), local)
        return cls()

    def device(self, name: str) -> torch.device:
        """``learner.device`` for this rank: ``auto``/``cuda`` mean this rank's own GPU."""
        import torch

        if name == "cuda" and not torch.cuda.is_available():
            from dreamer.errors import ConfigError

            raise ConfigError(
                "learner.device: cuda requested but no CUDA device is available; allowed: auto, cpu"
            )
        cuda = name == "cuda" or (name == "auto" and torch.cuda.is_available())
        return torch.device("cuda", self.local_rank) if cuda else torch.device("cpu")

    def broadcast_object(self, value):
        """Rank 0's ``value`` on every rank (e.g. a default run directory's timestamp)."""
        if not self.distributed:
            return value
        import torch.distributed as tdist

        holder = [value]
        tdist.broadcast_object_list(holder, src=0)
        return holder[0]

    def broadcast_tensors(self, tensors: Iterable[torch.Tensor]) -> None:
        """Rank 0's values into every rank's ``tensors``, in place."""
        import torch.distributed as tdist

        if self.distributed:
            for tensor in tensors:
                tdist.broadcast(tensor, src=0)

    def barrier(self) -> None:
        import torch.distributed as tdist

        if self.distributed:
            tdist.barrier()
