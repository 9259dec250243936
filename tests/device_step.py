"""The learner's captured step on a device other than the CPU, without a GPU: what the
first H200 run found (2026-12-04: imagination back on the CPU, a CPU ``bins`` copied
inside a CUDA graph capture), caught on any machine.

The learner is built as the trainer builds it and moved with its own ``.to(device)`` to
torch's ``meta`` device, where tensors have shapes and no data; then the body of the
step torchrl's stepper compiles and captures (the loss's forward and backward) runs
under ``OnDevice``, a dispatch mode that sees every operator's operands. Anything a
CUDA graph cannot hold fails there: an operand or result on the CPU (a tensor created
on, or copied to, the host; only empty ones, which hold no data, pass), a read of a
value on the host (``.item()``, ``bool()``) or an operator whose result's shape depends
on the data (``nonzero``, boolean indexing): both wait for the device."""

from __future__ import annotations

import contextlib
import traceback

import torch
from tensordict.nn import TensorDictParams
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

HOST_READS = {
    torch.ops.aten._local_scalar_dense.default,  # .item(), bool(), int(), float()
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.repeat_interleave.Tensor,
}


class HostTouched(AssertionError):
    pass


def caller() -> str:
    """The innermost frames of project or torchrl code that led to an operator."""
    frames = [
        frame
        for frame in traceback.extract_stack()[:-2]
        if "/dreamer/" in frame.filename or "/torchrl/" in frame.filename
    ]
    return "".join(traceback.format_list(frames[-3:]))


class OnDevice(TorchDispatchMode):
    """Fails on the first operator that involves the host (see the module's docstring)."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.operators = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.operators += 1
        if func in HOST_READS:
            raise HostTouched(f"{func} waits for the device, in:\n{caller()}")
        out = func(*args, **kwargs)
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        # (empty host tensors carry no data: torchrl's rollout marks keys with them)
        elsewhere = sorted({str(t.device) for t in tensors if t.device != self.device})
        if any(t.device != self.device and t.numel() for t in tensors) or (
            elsewhere and any(t.device == self.device for t in tensors)
        ):
            shapes = [(str(t.device), tuple(t.shape)) for t in tensors]
            raise HostTouched(f"{func} on {elsewhere} {shapes}, in:\n{caller()}")
        return out


def _params_apply_keeping_buffers(self, fn, recurse=True):
    """``TensorDictParams._apply`` with its buffers swapped rather than given the new
    ``.data`` (which a CPU tensor cannot take from a meta one, as it can from a CUDA one):
    the buffer objects the loss's functional calls hold stay the ones moved."""
    self._param_td._erase_cache()
    self._param_td = self._param_td.copy()
    buffers = dict(self._buffers)
    out = torch.nn.Module._apply(self, fn, recurse=recurse)
    for key, buffer in buffers.items():
        if buffer is not self._buffers[key]:
            torch.utils.swap_tensors(buffer, self._buffers[key])
        self._buffers[key] = buffer
    if not out._check_batch_size(raise_exception=False):
        out.auto_batch_size_()
    if not out._check_device(raise_exception=False):
        out.auto_device_()
    return out


@contextlib.contextmanager
def meta_moves(monkeypatch):
    """``.to("meta")`` as ``.to("cuda")`` works: parameters keep their identity (swapped,
    as ``set_data`` keeps them on CUDA), so modules torchrl shares stay shared; and
    torchrl's replay-value target takes the branch it takes while compiling or capturing
    (its vectorised one finds trajectory lengths with ``nonzero``, on the host)."""
    import torchrl.objectives.dreamer_v3 as dreamer_v3

    monkeypatch.setattr(TensorDictParams, "_apply", _params_apply_keeping_buffers)
    monkeypatch.setattr(dreamer_v3, "_is_dynamo_compiling", lambda: True)
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield torch.device("meta")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)


def captured_step(learner, batch) -> int:
    """The body torchrl's stepper compiles and captures (its ``_forward_backward`` less
    the autocast, which has no meta device), on ``learner``'s device, under ``OnDevice``;
    the number of operators it ran."""
    batch = batch.to(learner.device)  # the copy to the device: before the capture
    with OnDevice(learner.device) as mode:
        forward_backward(learner, batch)
    return mode.operators


def forward_backward(learner, batch) -> None:
    """The loss's forward and backward, as torchrl's stepper runs them."""
    stepper = learner.stepper
    sample = stepper._prepare_sample(batch.to(learner.device))
    losses = stepper.loss_module(sample)
    total = sum(value for key, value in losses.items() if str(key).startswith("loss_"))
    stepper.optimizer.zero_grad(set_to_none=False)
    total.backward()


class TracedOnDevice:
    """A torch.compile backend (AOT autograd, as inductor's) that checks every graph
    traced for compilation, forward and backward, before running it as traced: each
    node's value (a fake tensor) on ``device``, no operator that reads the host. The
    dispatch mode cannot watch compiled code (torch.compile refuses to trace under one),
    so the traced graphs are read instead."""

    def __init__(self, device: torch.device):
        from torch._dynamo.backends.common import aot_autograd

        self.device = device
        self.graphs = 0
        self.nodes = 0
        self.backend = aot_autograd(fw_compiler=self.check, bw_compiler=self.check)

    def check(self, graph_module, example_inputs):
        self.graphs += 1
        for node in graph_module.graph.nodes:
            self.nodes += 1
            if node.op == "call_function" and node.target in HOST_READS:
                raise HostTouched(f"{node.target} waits for the device, in:\n{node.stack_trace}")
            values = tree_flatten(node.meta.get("val"))[0]
            elsewhere = {
                str(v.device) for v in values if isinstance(v, torch.Tensor) and v.numel()
            } - {str(self.device)}
            if elsewhere:
                raise HostTouched(
                    f"{node.format_node()} on {sorted(elsewhere)}, in:\n{node.stack_trace}"
                )
        return graph_module.forward
