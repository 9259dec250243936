"""One DreamerV3 update: loss, optimizer and target update through torchrl's stepper."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.trainers.algorithms import DreamerV3OptimizationStepper, DreamerV3Optimizer

from dreamer.agent.build import Agent


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Learner:
    def __init__(self, agent: Agent, learner_cfg, device: torch.device):
        self.agent = agent
        self.device = device
        self.loss = agent.loss.to(device)
        self.optimizer = DreamerV3Optimizer(
            self.loss.parameters(),
            lr=learner_cfg.lr,
            agc=learner_cfg.grad_clip,
            warmup_steps=learner_cfg.warmup,
        )
        on_cuda = device.type == "cuda"
        self.stepper = DreamerV3OptimizationStepper(
            self.loss,
            self.optimizer,
            agent.target_updater,
            compile_train_step=on_cuda,
            cudagraph=on_cuda,
            mixed_precision=on_cuda,
        )
        self.updates = 0
        self._warm = not on_cuda

    def update(self, batch: TensorDictBase) -> dict[str, float]:
        """One optimizer step on a [batch, length] replay sample; returns the losses."""
        batch = batch.to(self.device)
        if not self._warm:
            self.stepper.warmup(batch)
            self._warm = True
        metrics = self.stepper.step(None, batch)
        self.updates += 1
        return {
            key: float(value)
            for key, value in metrics.items()
            if isinstance(key, str) and value.numel() == 1
        }

    def policy_weights(self) -> torch.nn.Module:
        return self.agent.policy

    def state_dict(self) -> dict:
        return {
            "loss": self.loss.state_dict(),
            "stepper": self.stepper.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.loss.load_state_dict(state["loss"])
        self.stepper.load_state_dict(state["stepper"])
        self.updates = state["updates"]
