"""FLOPs of what runs under it, by torch's own formulas (matmuls, convolutions,
attention) over every op dispatched. torch's ``FlopCounterMode`` cannot track modules
that take tensordicts. Imports torch alone, so a peer's venv (sheeprl) can use it too."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class FlopCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out
