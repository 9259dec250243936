"""The DreamerV3 loss as torchrl's own losses compute it: the reference the project's
loss (``DreamerLoss.forward``) is held equal to, term by term and gradient by gradient.

torchrl's ``DreamerV3Loss.forward`` composed as the official agent, as ``DreamerLoss``
composes it: every term unweighted by torchrl and weighed by ``weighted_terms``, and
imagination from the last ``imag_last`` steps of every sequence."""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from dreamer.agent.loss import finite_starts, imagined_steps, weighted_terms


class TorchrlReference(nn.Module):
    """``loss``'s terms from torchrl's model, actor and value losses (its parameters are
    ``loss``'s: a submodule); read-through for ``in_keys``, ``tensor_keys`` ... as the
    stepper needs. ``precision`` ``"bf16"``: under bf16 autocast on the sample's device,
    as the loss runs it (torchrl's stepper autocasts CUDA only)."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss
        self.precision = "fp32"

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.loss, name)

    def forward(self, sample: TensorDictBase) -> TensorDictBase:
        device = sample.get(("next", "reward")).device
        bf16 = torch.autocast(device.type, dtype=torch.bfloat16)
        with bf16 if self.precision == "bf16" else contextlib.nullcontext():
            return self.terms(sample)

    def terms(self, sample: TensorDictBase) -> TensorDictBase:
        loss = self.loss
        keys = loss.tensor_keys
        model_losses, posterior = loss.model_loss(sample)
        replayed = posterior.get("next")
        last = imagined_steps(loss.imag_last, sample.shape[-1])
        starts = replayed if last is None else replayed[..., -last:]
        state, belief = finite_starts(starts.get(keys.state), starts.get(keys.belief))
        actor_keys = loss.actor_loss.tensor_keys
        actor_input = TensorDict(
            {
                actor_keys.state: state.reshape(-1, state.shape[-1]),
                actor_keys.belief: belief.reshape(-1, belief.shape[-1]),
            },
            [starts.numel()],
        )
        actor_losses, imagined = loss.actor_loss(actor_input)
        value_losses, _ = loss.value_loss(imagined.detach())
        if loss.learns_replay_value:
            value_keys = loss.value_loss.tensor_keys
            replay_features = starts.select(*loss.value_loss.value_model.in_keys)
            replay_features.set(
                value_keys.bootstrap,
                imagined.get("lambda_target")[..., 0, 0].reshape(starts.shape),
            )
            targets = sample.get("next").select(
                value_keys.reward, value_keys.done, value_keys.terminated
            )
            replay_features.set("next", targets if last is None else targets[..., -last:])
            replay_value = loss.value_loss.replay_value_loss(
                replay_features, horizon=loss.continuation_horizon, lmbda=loss.lmbda
            )["loss_replay_value"]
        else:
            replay_value = state.new_zeros(())
        model = model_losses.apply(lambda value: value.squeeze())
        terms = {
            "rec": model.get("loss_model_reco"),
            "rew": model.get("loss_model_reward"),
            "con": model.get("loss_model_continue"),
            "dyn": model.get("loss_model_dynamic"),
            "rep": model.get("loss_model_representation"),
            "policy": actor_losses.get("loss_actor"),
            "value": value_losses.get("loss_value"),
            "repval": replay_value,
        }
        result = TensorDict(weighted_terms(terms, loss.scales), [])
        result.update(actor_losses.exclude("loss_actor"))
        result.update(value_losses.exclude("loss_value"))
        result.set("replay_value", replay_value.detach())
        result.set(keys.replay_context, replayed.select(keys.state, keys.belief).detach())
        return result
