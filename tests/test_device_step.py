"""The learner's captured step touches nothing on the host when it runs on another
device (tests/device_step.py: the meta device as the stand-in for CUDA), for every
kind of agent; and the stand-in itself catches what the first GPU run hit."""

import pytest
import torch

from dreamer.agent.build import build_agent
from dreamer.command_line import load
from dreamer.data.replay import random_batch
from dreamer.learning.learner import Learner
from tests.batches import real_batch
from tests.device_step import (
    HostTouched,
    TracedOnDevice,
    captured_step,
    forward_backward,
    meta_moves,
)
from tests.test_fused import AGENTS


def learner_and_batch(kind: str, device: torch.device):
    overrides, spaces = AGENTS[kind]
    cfg = load(
        ["experiment=smoke", *overrides]
        + ["learner.compile=false", "learner.cudagraph=false", "learner.precision=fp32"]
    )
    length = 8
    if spaces is None:
        spaces, batch = real_batch(cfg, 2, length)
    else:
        batch = random_batch(spaces, 2, length)
    torch.manual_seed(0)
    learner = Learner(build_agent(cfg.model, cfg.learner, spaces), cfg.learner, device)
    return learner, batch


@pytest.mark.parametrize("kind", list(AGENTS))
def test_the_captured_step_stays_on_the_device(monkeypatch, kind):
    with meta_moves(monkeypatch) as device:
        learner, batch = learner_and_batch(kind, device)
        assert captured_step(learner, batch) > 1000  # the whole loss and its backward ran
        grads = [p.grad for p in learner.loss.parameters()]
        assert all(grad is not None and grad.device == device for grad in grads)


# what is compiled (the RSSM steps, the losses after imagination) differs between kinds
# by its action head only: a pixel or multi-key agent's differ from vector_discrete's in
# their shapes (the encoder and decoder are not compiled); ~8 s of tracing per kind
COMPILED_KINDS = ["vector_discrete", "vector_continuous", "masked_multi_head"]


@pytest.mark.parametrize("kind", COMPILED_KINDS)
def test_the_compiled_graphs_stay_on_the_device(monkeypatch, kind):
    """What is traced for compilation (the RSSM steps, the losses after imagination,
    forward and backward graphs), checked node by node on the meta device; then the
    step with those graphs runs there. fp32 only: autocast has no meta device (bf16
    runs these graphs under CUDA's autocast, checked on a GPU by the GPU check)."""
    with meta_moves(monkeypatch) as device:
        learner, batch = learner_and_batch(kind, device)
        traced = TracedOnDevice(device)
        learner.loss.compile_steps(behavior=True, backend=traced.backend)
        forward_backward(learner, batch)  # (torch.compile traces under no dispatch mode)
        # posterior and prior steps and the behaviour: forward and backward (the prior
        # step, run without grad, has no backward)
        assert traced.graphs == 5 and traced.nodes > 500


def test_the_stand_in_catches_a_host_tensor_and_a_host_read(monkeypatch):
    """What the GPU run found, put back: the loss moved by torchrl's own ``_apply`` (as
    before ``DreamerLoss._apply``: the value head's ``bins``, held outside the module
    tree, stay on the CPU); a step that reads a value on the host."""
    from torchrl.objectives import LossModule

    from dreamer.agent.loss import DreamerLoss

    with meta_moves(monkeypatch) as device:
        with monkeypatch.context() as reverted:
            reverted.setattr(DreamerLoss, "_apply", LossModule._apply)
            learner, batch = learner_and_batch("vector_discrete", device)
        assert learner.loss.networks.value_decode.bins.device == torch.device("cpu")
        with pytest.raises(HostTouched, match="cpu"):
            captured_step(learner, batch)
        # the same, found in the graph traced for compiling the losses after imagination
        learner.loss._behavior = torch.compile(
            learner.loss._behavior, fullgraph=True, backend=TracedOnDevice(device).backend
        )
        with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="HostTouched.*cpu"):
            forward_backward(learner, batch)

        learner, batch = learner_and_batch("vector_discrete", device)
        forward = DreamerLoss.forward

        def reads_the_host(self, sample):
            result = forward(self, sample)
            if result.get("loss_actor") > 0:  # bool() of a device tensor: a sync
                result.set("loss_actor", result.get("loss_actor") * 1)
            return result

        monkeypatch.setattr(DreamerLoss, "forward", reads_the_host)
        with pytest.raises(HostTouched, match="_local_scalar_dense"):
            captured_step(learner, batch)
