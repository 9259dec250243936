"""The whole DreamerV3 loss in one function, ``dreamer_v3_loss``: the official
``dreamerv3/agent.py``'s three sections (world model, imagination, replay), each term
times its ``learner.loss_scales`` entry.

The terms come unweighted from one of two rollouts over the same torchrl modules (the
owners of every parameter): ``DreamerLoss`` below (``learner.rollout=torchrl``) or the
fused scans of ``dreamer/learning/fused.py``; which one changes the speed, not the terms.
torchrl's stepper sums the ``loss_*`` entries returned here and runs backward.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives import DreamerV3Loss


def dreamer_v3_loss(terms: dict[str, torch.Tensor], scales: dict[str, float]) -> dict:
    """The weighted entries torchrl's stepper sums into the total it minimises.

    ``terms``: each of the eight unweighted scalar losses under its official name;
    ``scales``: ``learner.loss_scales``. ``learner.free_nats`` and ``learner.slowreg``
    shape the terms themselves (the KL clip, the slow-critic pull of both critics).
    """
    return {
        # World model: reconstruct the observations, predict reward and continuation,
        # keep the prior close to the posterior (dyn) and the posterior predictable (rep)
        "loss_model_reco": scales["rec"] * terms["rec"],
        "loss_model_reward": scales["rew"] * terms["rew"],
        "loss_model_continue": scales["con"] * terms["con"],
        "loss_model_dynamic": scales["dyn"] * terms["dyn"],
        "loss_model_representation": scales["rep"] * terms["rep"],
        # Imagination: the actor on imagined returns (REINFORCE with an entropy bonus),
        # the critic on the same returns
        "loss_actor": scales["policy"] * terms["policy"],
        "loss_value": scales["value"] * terms["value"],
        # Replay: the critic on replayed states, bootstrapped from their imagined returns
        "loss_replay_value": scales["repval"] * terms["repval"],
    }


class DreamerLoss(DreamerV3Loss):
    """The terms from torchrl's modules (``learner.rollout=torchrl``), weighed by
    ``dreamer_v3_loss``. torchrl's forward, with what it has no knob for, as the
    official agent: every term unweighted (its model loss is built with weights 1), and
    ``imag_last`` (``learner.imag_last``): imagination starts from the last K replayed
    steps of every sequence (0: all of them), and the replay-value term learns on those
    K steps, bootstrapped from their imagined returns.
    """

    def __init__(self, *args, scales: dict[str, float], imag_last: int = 0, **kwargs):
        # the replay-value term is computed only where it weighs something
        super().__init__(*args, replay_value_loss_weight=float(scales["repval"] > 0), **kwargs)
        self.scales = scales
        self.imag_last = imag_last

    def _apply(self, fn):
        """``.to(device)``, ``.double()``, ... reach what torchrl keeps outside the module
        tree: the imagination env (its ``device``, where its rollout puts every imagined
        state: a CPU env moved imagination back to the host) and the buffers of modules
        held only in an attribute (the value head's ``SymExpTwoHot`` ``bins``; their
        parameters are the loss's own, already converted)."""
        result = super()._apply(fn)
        for module in off_tree_modules(self):
            for name, buffer in module.named_buffers(recurse=False):
                module._buffers[name] = fn(buffer)
        env = self.actor_loss.model_based_env
        reference = next(self.parameters())
        if env.device != reference.device:
            env.to(reference.device)
        return result

    def forward(self, sample: TensorDictBase) -> TensorDictBase:
        keys = self.tensor_keys
        model_losses, posterior = self.model_loss(sample)
        replayed = posterior.get("next")
        last = imagined_steps(self.imag_last, sample.shape[-1])
        starts = replayed if last is None else replayed[..., -last:]
        state, belief = finite_starts(starts.get(keys.state), starts.get(keys.belief))
        actor_keys = self.actor_loss.tensor_keys
        actor_input = TensorDict(
            {
                actor_keys.state: state.reshape(-1, state.shape[-1]),
                actor_keys.belief: belief.reshape(-1, belief.shape[-1]),
            },
            [starts.numel()],
        )
        actor_losses, imagined = self.actor_loss(actor_input)
        value_losses, _ = self.value_loss(imagined.detach())
        if self.replay_value_loss_weight:
            value_keys = self.value_loss.tensor_keys
            replay_features = starts.select(*self.value_loss.value_model.in_keys)
            replay_features.set(
                value_keys.bootstrap,
                imagined.get("lambda_target")[..., 0, 0].reshape(starts.shape),
            )
            targets = sample.get("next").select(
                value_keys.reward, value_keys.done, value_keys.terminated
            )
            replay_features.set("next", targets if last is None else targets[..., -last:])
            replay_value = self.value_loss.replay_value_loss(
                replay_features, horizon=self.continuation_horizon, lmbda=self.lmbda
            )["loss_replay_value"]
        else:
            replay_value = state.new_zeros(())
        model = model_losses.apply(torch.squeeze)
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
        result = TensorDict(dreamer_v3_loss(terms, self.scales), [])
        result.update(actor_losses.exclude("loss_actor"))
        result.update(value_losses.exclude("loss_value"))
        result.set("replay_value", replay_value.detach())
        result.set(
            keys.replay_context,
            replayed.select(keys.state, keys.belief).detach(),
        )
        return result


def finite_starts(state: torch.Tensor, belief: torch.Tensor):
    """Imagination's start states, detached; all zeros where any value is NaN or Inf.

    A world model that overflowed already makes the total non-finite, so the optimizer
    skips the update (``SkippingOptimizer``); from such starts the actor's sampler would
    raise on NaN logits before any gradient exists. The check is a tensor, no sync."""
    state, belief = state.detach(), belief.detach()
    finite = torch.isfinite(state).all() & torch.isfinite(belief).all()
    return torch.where(finite, state, 0.0), torch.where(finite, belief, 0.0)


def imagined_steps(imag_last: int, length: int) -> int | None:
    """How many of a sequence's last steps imagination starts from; None: all of them
    (``learner.imag_last`` 0, or not less than the sequence)."""
    return imag_last if 0 < imag_last < length else None


def off_tree_modules(root: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules reachable from ``root`` but not in its tree (torchrl's losses keep the
    source modules of their functional copies in plain attributes), which
    ``root._apply`` does not visit: each once."""
    seen = {id(module) for module in root.modules()}
    found, queue = [], [*root.modules()]
    while queue:
        module = queue.pop()
        for value in [*vars(module).values(), *module._modules.values()]:
            if isinstance(value, torch.nn.Module) and id(value) not in seen:
                seen.add(id(value))
                found.append(value)
                queue.append(value)
    return found
