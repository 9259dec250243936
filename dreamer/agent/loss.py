"""The DreamerV3 loss: the official agent's terms, each times its ``learner.loss_scales`` entry.

torchrl's ``DreamerV3ModelLoss`` / ``ActorLoss`` / ``ValueLoss`` own every parameter and buffer
and are the reference (tests/test_fused.py); the sequential parts run as scans (``scans.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torch.nn import functional
from torchrl.modules.distributions.utils import has_analytic_entropy, rsample_and_log_prob
from torchrl.objectives import DreamerV3Loss
from torchrl.objectives.dreamer_v3 import categorical_kl_terms, symlog

from dreamer.agent.scans import ActorParts, RSSMCell, head_output, two_hot_cross_entropy
from dreamer.torchrl_compat import (
    match_trailing_dim,
    reduce_loss,
    replay_value_target,
    return_scale,
)


def weighted_terms(terms: dict[str, torch.Tensor], scales: dict[str, float]) -> dict:
    """The weighted entries torchrl's stepper sums into the total it minimises; ``terms``:
    the eight unweighted losses by official name, ``scales``: ``learner.loss_scales``."""
    return {
        "loss_model_reco": scales["rec"] * terms["rec"],
        "loss_model_reward": scales["rew"] * terms["rew"],
        "loss_model_continue": scales["con"] * terms["con"],
        "loss_model_dynamic": scales["dyn"] * terms["dyn"],
        "loss_model_representation": scales["rep"] * terms["rep"],
        "loss_actor": scales["policy"] * terms["policy"],
        "loss_value": scales["value"] * terms["value"],
        "loss_replay_value": scales["repval"] * terms["repval"],
    }


@dataclass
class Networks:
    """The networks the loss runs, by role; their parameters are the torchrl losses'."""

    obs_keys: list  # the replayed observations the encoder reads, in its argument order
    encoder: nn.Module
    decoder: nn.Module
    prior: nn.Module  # torchrl's RSSMPriorV3 (block GRU)
    posterior: nn.Module  # RSSMPosteriorV3
    reward: nn.Module  # reward logits
    reward_decode: nn.Module  # logits -> reward (SymExpTwoHot)
    continues: nn.Module  # continuation logit
    value: nn.Module  # the critic's logits
    value_decode: nn.Module
    actor: nn.Module  # ProbabilisticTensorDictSequential: network, then distribution


class DreamerLoss(DreamerV3Loss):
    """torchrl's three DreamerV3 losses composed as the official agent, each term weighed here
    (torchrl's weights are 1). ``imag_last``: imagination and the replay-value term start from
    each sequence's last K steps (0: all). ``precision="bf16"`` autocasts on any device."""

    def __init__(
        self, *args, networks: Networks, scales: dict[str, float], imag_last: int = 0, **kwargs
    ):
        # torchrl's weight only switches the replay-value term on; loss_scales weighs it
        learns_replay_value = scales["repval"] > 0
        super().__init__(*args, replay_value_loss_weight=float(learns_replay_value), **kwargs)
        self.learns_replay_value = learns_replay_value
        model_loss, actor_loss, value_loss = self.model_loss, self.actor_loss, self.value_loss
        if model_loss.kl_mode != "separate" or not actor_loss.use_reinforce:
            raise ValueError("the loss computes separate KL terms and REINFORCE")
        if value_loss.value_loss != "two_hot" or model_loss.reco_loss != "l2":
            raise ValueError("the loss computes two-hot values and l2 reconstruction")
        self.scales = scales
        self.imag_last = imag_last
        self.networks = networks
        self.cell = RSSMCell(networks.prior, networks.posterior)
        self.actor_parts = ActorParts(networks.actor)
        self.precision = "fp32"

    def compile_steps(self, behavior: bool, backend: str | Callable = "inductor") -> None:
        """torch.compile the rollouts' step functions and, with ``behavior``, ``_behavior`` (one
        loop-free graph, drawing nothing: the entropies are analytic); the encoder and decoder
        stay eager (compiled, they doubled the cold compile). ``backend``: tests count graphs."""
        self.cell.compile(backend)
        if behavior:
            self._behavior = torch.compile(
                self._behavior, dynamic=False, fullgraph=True, backend=backend
            )

    def _apply(self, fn):
        """Also converts what torchrl keeps outside the module tree: the imagination env's
        ``device`` and buffers of modules held in attributes (the value head's ``bins``)."""
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
        batch = sample.batch_size
        next_td = sample.get("next")
        device = next_td.get("reward").device
        bf16 = self.precision == "bf16"
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else None
        with autocast or contextlib.nullcontext():
            terms, states, beliefs, wm_features = self._world_model(sample)
            last = imagined_steps(self.imag_last, batch[-1])
            start_state, start_belief = finite_starts(states, beliefs)
            if last is not None:
                start_state, start_belief = (
                    start_state[..., -last:, :],
                    start_belief[..., -last:, :],
                )
            features, actions = self._imagine(
                start_state.reshape(-1, states.shape[-1]),
                start_belief.reshape(-1, beliefs.shape[-1]),
                self.actor_loss.imagination_horizon,
            )
            result = self._behavior(
                terms,
                states,
                beliefs,
                wm_features,
                features,
                actions,
                next_td.get("reward"),
                next_td.get("done"),
                next_td.get("terminated", None),
                last,
            )
        out = TensorDict(result, [])
        out.set(
            self.tensor_keys.replay_context,
            TensorDict({"state": states.detach(), "belief": beliefs.detach()}, batch),
        )
        return out

    # -- world model -------------------------------------------------------------
    def _world_model(self, sample: TensorDictBase):
        model_loss, nets = self.model_loss, self.networks
        batch = sample.batch_size
        observations = [sample.get(key) for key in nets.obs_keys]
        embedding = nets.encoder(*observations)
        reset = sample.get(self.tensor_keys.is_init, None)
        action = sample.get("action")
        if reset is None:
            reset = torch.zeros(*batch, 1, dtype=torch.bool, device=action.device)
        # every window starts from the zero latent (ZeroStartRollout); in bf16 the state is
        # bf16 as the posterior's samples are (one-hot: exact): a compiled step sees one dtype
        start = batch[:-1]
        state_dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        states, beliefs, posterior_logits = self.cell.observe(
            torch.zeros(*start, self.cell.stoch, device=action.device, dtype=state_dtype),
            torch.zeros(*start, self.cell.deter, device=action.device),
            action,
            embedding,
            reset.reshape(*batch, 1),
        )
        prior_logits = self.cell.prior_logits(beliefs)
        dynamic, representation = categorical_kl_terms(
            posterior_logits.float(),
            prior_logits.float(),
            free_nats=model_loss.free_bits,
            unimix=model_loss.unimix,
        )
        reconstruction = self._reconstruction(observations, states, beliefs)
        next_td = sample.get("next")
        features = torch.cat([states, beliefs], -1)
        reward_logits = head_output(nets.reward, states, beliefs, features).float()
        reward_loss = two_hot_cross_entropy(
            reward_logits, next_td.get("reward"), model_loss.reward_bins
        ).mean()
        terminated = next_td.get("terminated", None)
        if terminated is None:
            terminated = next_td.get("done")
        target = (~terminated).float() * model_loss.continue_target_scale
        continue_loss = functional.binary_cross_entropy_with_logits(
            head_output(nets.continues, states, beliefs, features).squeeze(-1).float(),
            target.squeeze(-1),
        )
        terms = {
            "rec": reconstruction,
            "rew": reward_loss,
            "con": continue_loss,
            "dyn": dynamic,
            "rep": representation,
        }
        return terms, states, beliefs, features

    def _reconstruction(self, observations, states, beliefs) -> torch.Tensor:
        """The decoder's l2 loss summed over observation keys, as torchrl's model loss."""
        predictions = self.networks.decoder(states, beliefs)
        if isinstance(predictions, torch.Tensor):
            predictions = (predictions,)
        use_symlog = self.model_loss.reco_symlog
        if isinstance(use_symlog, bool):
            use_symlog = [use_symlog] * len(predictions)
        reconstruction = 0
        for observation, prediction, transform in zip(
            observations, predictions, use_symlog, strict=True
        ):
            target = observation.contiguous()
            prediction = prediction.contiguous().float()
            if transform:
                target, prediction = symlog(target), symlog(prediction)
            elif not target.is_floating_point():
                target = target.float() / 255.0
            error = (target - prediction).pow(2).reshape(*states.shape[:-1], -1).sum(-1)
            reconstruction = reconstruction + error.mean()
        return reconstruction

    # -- imagination ---------------------------------------------------------------
    @torch.no_grad()
    def _imagine(self, state: torch.Tensor, belief: torch.Tensor, horizon: int):
        """[N, H+1, state + belief] imagined features (the start included), [N, H] actions."""
        split = self.cell._split_first_layer()
        size = state.shape[-1]
        features = state.new_empty(state.shape[0], horizon + 1, size + belief.shape[-1])
        features[:, 0, :size], features[:, 0, size:] = state, belief
        actions = []
        for t in range(horizon):
            action = self.actor_parts.sample(self.actor_parts.dist(state, belief))
            state, belief = self.cell.imagine_step(state, belief, action, split)
            features[:, t + 1, :size], features[:, t + 1, size:] = state, belief
            actions.append(action)
        return features, torch.stack(actions, 1)

    def _value(self, state, belief, features=None) -> torch.Tensor:
        nets = self.networks
        return nets.value_decode(head_output(nets.value, state, belief, features).float())

    def _slow_value(self, state, belief, features=None) -> torch.Tensor:
        # not ``with params.to_module(...)``: after an exception it leaves the slow weights in
        # the critic (the final checkpoint saves them), and it turns Ctrl-C into a RuntimeError
        value_loss = self.value_loss
        critic = value_loss.value_model
        fast = value_loss.target_value_model_params.to_module(critic, preserve_module_state=False)
        try:
            with torch.no_grad():
                return self._value(state, belief, features)
        finally:
            fast.to_module(critic, return_swap=False, preserve_module_state=False)

    def _returns(self, im_states, im_beliefs, features, horizon: int):
        """The critic's logits on every imagined state (with gradients), and the detached
        targets: lambda returns, baseline, discount and continuation."""
        actor_loss, nets = self.actor_loss, self.networks
        value_logits_all = head_output(nets.value, im_states, im_beliefs, features).float()
        with torch.no_grad():
            next_s, next_b = im_states[:, 1:], im_beliefs[:, 1:]
            reward_logits = head_output(nets.reward, next_s, next_b, features[:, 1:]).float()
            reward = nets.reward_decode(reward_logits)
            values = nets.value_decode(value_logits_all.detach())
            next_value, baseline = values[:, 1:], values[:, :horizon]
            continue_logits = head_output(nets.continues, im_states, im_beliefs, features)
            continues = torch.sigmoid(continue_logits.float())
            continuation, root = continues[:, 1:], continues[:, :horizon]
            lambda_target = actor_loss.lambda_target(reward, next_value, continuation)
            if actor_loss.discount_loss:
                gamma = actor_loss.value_estimator.gamma.to(lambda_target.device)
                discount = torch.cat([root[:, :1], gamma * root[:, 1:]], 1).cumprod(1)
            else:
                discount = torch.ones_like(lambda_target)
        return value_logits_all, lambda_target, baseline, discount, continuation

    # -- behaviour and replay -------------------------------------------------------
    def _behavior(
        self, terms, states, beliefs, wm_features, features, actions, reward, done, terminated, last
    ) -> dict[str, torch.Tensor]:
        """Everything after imagination: the heads, the actor, critic and replay-value
        losses, and the weighted terms; one graph for ``compile_steps``."""
        actor_loss, value_loss = self.actor_loss, self.value_loss
        horizon = actions.shape[1]
        size = states.shape[-1]
        im_states, im_beliefs = features[..., :size], features[..., size:]
        now_s, now_b, now_f = im_states[:, :horizon], im_beliefs[:, :horizon], features[:, :horizon]
        value_logits_all, lambda_target, baseline, discount, continuation = self._returns(
            im_states, im_beliefs, features, horizon
        )
        # actor: REINFORCE on stopped imagined states and actions, as torchrl's
        dist = self.actor_parts.dist(now_s, now_b)
        log_prob = match_trailing_dim(dist.log_prob(actions).float(), lambda_target)
        scale = return_scale(actor_loss, lambda_target)
        advantage = (lambda_target - baseline) / scale
        actor_value = -(discount * log_prob * advantage).mean()
        if actor_loss.entropy_bonus > 0:
            if has_analytic_entropy(dist):
                entropy = dist.entropy()
            else:
                _, entropy_log_prob = rsample_and_log_prob(dist)
                entropy = -entropy_log_prob
            entropy = (discount * match_trailing_dim(entropy.float(), discount)).mean()
            actor_value = actor_value - actor_loss.entropy_bonus * entropy
        else:
            entropy = actor_value.new_zeros(())

        # critic on the imagined states
        value_logits = value_logits_all[:, :horizon]
        target = lambda_target.squeeze(-1)
        step_discount = discount.squeeze(-1)
        critic, slow_loss = self._critic(value_logits, target, now_s, now_b, now_f)

        replay_value = self._replay_value(
            reward, done, terminated, states, beliefs, wm_features, lambda_target, last
        )
        terms = {key: value.squeeze() for key, value in terms.items()}
        terms["policy"] = actor_value
        terms["value"] = reduce_loss(value_loss, step_discount * critic)
        terms["repval"] = replay_value
        result = weighted_terms(terms, self.scales)
        result.update(
            actor_entropy=entropy.detach(),
            return_low=actor_loss.return_low.detach().clone(),
            return_high=actor_loss.return_high.detach().clone(),
            return_scale=scale.detach().clone(),
            continuation_mean=continuation.mean(),
            value_slow_loss=reduce_loss(value_loss, step_discount * slow_loss).detach(),
        )
        result["replay_value"] = replay_value.detach()
        return result

    def _replay_value(
        self, reward, done, terminated, states, beliefs, features, lambda_target, last
    ) -> torch.Tensor:
        """torchrl's replay-value term on the ``last`` steps (None: all): the critic on the
        posterior states, bootstrapped from each state's first imagined return."""
        value_loss = self.value_loss
        if not self.learns_replay_value:
            return states.new_zeros((), dtype=torch.float32)
        if last is not None:
            reward, done = reward[..., -last:, :], done[..., -last:, :]
            terminated = None if terminated is None else terminated[..., -last:, :]
            states, beliefs = states[..., -last:, :], beliefs[..., -last:, :]
            features = features[..., -last:, :]
        target = replay_value_target(
            reward,
            done,
            terminated,
            lambda_target[..., 0, 0].reshape(done.shape[:-1]),
            self.continuation_horizon,
            self.lmbda,
        )
        weight = ~done.squeeze(-1)[..., :-1]
        prediction = head_output(self.networks.value, states, beliefs, features)
        prediction = prediction.float()[..., :-1, :]
        critic, _ = self._critic(
            prediction, target, states, beliefs, features, steps=slice(None, -1)
        )
        return reduce_loss(value_loss, weight.to(critic.dtype) * critic)

    def _critic(self, logits, target, state, belief, features, steps=slice(None)):
        """The critic's two-hot loss on ``target`` plus, weighted, on the slow critic's values
        at ``steps`` (the regulariser alone: zeros without one)."""
        value_loss = self.value_loss
        critic = two_hot_cross_entropy(logits, target, value_loss.value_bins)
        if not value_loss.slow_critic_regularization:
            return critic, torch.zeros_like(critic)
        slow = self._slow_value(state, belief, features)[..., steps, 0]
        slow_loss = two_hot_cross_entropy(logits, slow, value_loss.value_bins)
        return critic + value_loss.slow_critic_regularization * slow_loss, slow_loss


def finite_starts(state: torch.Tensor, belief: torch.Tensor):
    """Imagination's start states, detached; all zeros if any is NaN/Inf (no sync): the update
    is skipped then, and the actor's sampler would raise on NaN logits first."""
    state, belief = state.detach(), belief.detach()
    finite = torch.isfinite(state).all() & torch.isfinite(belief).all()
    return torch.where(finite, state, 0.0), torch.where(finite, belief, 0.0)


def imagined_steps(imag_last: int, length: int) -> int | None:
    """How many last steps imagination starts from; None: all (``imag_last`` 0 or >= length)."""
    return imag_last if 0 < imag_last < length else None


def off_tree_modules(root: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules reachable from ``root`` outside its tree, each once: torchrl's losses keep
    their functional copies' sources in plain attributes, which ``_apply`` does not visit."""
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
