"""Losses and gradients of one forward/backward through torchrl's stepper: how the
loss is held equal to torchrl's reference (tests and the GPU check use it alike)."""

from __future__ import annotations

import contextlib

import torch

from tests.ddp_updates import same_draws

RTOL = 1e-5


def relative_error(mine: torch.Tensor, reference: torch.Tensor) -> float:
    """The norm of the difference over the reference's (a gradient's error)."""
    return float((mine - reference).norm() / reference.norm().clamp_min(1e-12))


def losses_and_gradients(loss_module, stepper_loss, sample, fixed: bool, mode: str = "fp32"):
    """One forward/backward of ``stepper_loss`` (``loss_module`` owns the parameters);
    the loss's buffers (return statistics) are put back afterwards so both paths start
    from the same state. ``fixed``: fixed draws (uniforms 0.5, the most likely choice).
    ``mode``: ``fp32`` eager; ``bf16`` (the loss's own autocast, on any device) or on
    CUDA ``bf16_cudagraph`` (the forward/backward captured), each through the stepper's
    own update at lr 0."""
    from torchrl.trainers.algorithms import DreamerV3OptimizationStepper

    optimizer = torch.optim.SGD(loss_module.parameters(), lr=0.0)
    stepper = DreamerV3OptimizationStepper(
        stepper_loss,
        optimizer,
        None,
        compile_train_step=False,
        cudagraph=mode == "bf16_cudagraph",
    )
    stepper_loss.precision = "fp32" if mode == "fp32" else "bf16"
    saved = [b.clone() for b in loss_module.buffers()]
    for p in loss_module.parameters():
        p.grad = None
    with same_draws() if fixed else contextlib.nullcontext():
        if mode == "fp32":
            torch.manual_seed(3)
            out = stepper._forward_backward(stepper._prepare_sample(sample.clone()))
        else:
            if mode == "bf16_cudagraph":
                stepper.warmup(sample.clone())
            torch.manual_seed(3)
            out = stepper.step(None, sample.clone())
    stepper_loss.precision = "fp32"
    grads = {n: p.grad.clone() for n, p in loss_module.named_parameters() if p.grad is not None}
    buffers = [b.clone() for b in loss_module.buffers()]
    with torch.no_grad():
        for b, s in zip(loss_module.buffers(), saved):
            b.copy_(s)
    return out, grads, buffers
