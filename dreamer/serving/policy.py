"""A trained run's acting policy, in your own loop.

    from dreamer import Policy
    policy = Policy.load("runs/crafter/20260101-120000", device="cpu")
    action, state = policy.act(obs, state)   # state=None at an episode's start

Only the encoder, the RSSM cell and the actor are built: no decoder, heads or loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from tensordict.nn import InteractionType, set_interaction_type

from dreamer.agent.acting import GreedyActingStep, env_action
from dreamer.agent.build import build_acting, build_agent, latent_sizes
from dreamer.agent.spaces import EnvSpaces, spaces_from_dict
from dreamer.runtime import checkpoint, rotation

MODES = {"greedy": InteractionType.DETERMINISTIC, "sample": InteractionType.RANDOM}


def acting_weights(loss_state: dict, model, learner, spaces: EnvSpaces) -> dict:
    """The acting policy's state dict from a checkpoint's loss state dict, its names read
    off a miniature agent of the same layout (structure, not sizes, decides them)."""
    tiny = {
        **OmegaConf.to_container(model),
        "deter": 16,
        "hidden": 16,
        "stoch": 2,
        "classes": 8,
        "units": 8,
    }
    tiny.update(cnn_depth=4, blocks=1, bins=3)  # torchrl's image decoder needs multiples of 8
    agent = build_agent(OmegaConf.create(tiny), learner, spaces)
    return {name: loss_state[source] for name, source in agent.loss_names(agent.policy).items()}


class Policy:
    """``act`` maps observations (one env's or a batch's, numpy or torch, dict or array)
    and the recurrent state to the env's actions (as the env takes them, numpy or torch
    as the observations came) and the next state."""

    def __init__(self, module, spaces: EnvSpaces, model, device: str = "cpu", step: int = 0):
        self.module = module.to(device).eval()
        self.spaces = spaces
        self.model = model
        self.device = torch.device(device)
        self.step = step  # the env step of the checkpoint
        self.state_size, self.belief_size = latent_sizes(model)

    @classmethod
    def load(cls, path: str | Path, device: str = "cpu") -> Policy:
        """From a run directory, its ``checkpoints`` folder or a file (``rotation.find``)."""
        found = rotation.find(path)
        state = checkpoint.load(found)
        cfg = state["config"]
        model, learner = OmegaConf.create(cfg["model"]), OmegaConf.create(cfg["learner"])
        spaces = spaces_from_dict(state["spaces"])
        module = build_acting(model, spaces)
        module.load_state_dict(acting_weights(state["learner"]["loss"], model, learner, spaces))
        return cls(module, spaces, model, device, state["steps"]["env_steps"])

    def greedy_step(self) -> GreedyActingStep:
        """The greedy step as a plain tensor module (what ``dreamer.export`` exports)."""
        return GreedyActingStep(self.module, self.spaces, self.model.unimix).eval()

    def initial_state(self, batch: int) -> TensorDict:
        zeros = lambda size: torch.zeros(batch, size, device=self.device)  # noqa: E731
        return TensorDict(
            state=zeros(self.state_size),
            belief=zeros(self.belief_size),
            previous_action=zeros(self.spaces.action_dim),
            is_init=torch.ones(batch, dtype=torch.bool, device=self.device),
            batch_size=[batch],
            device=self.device,
        )

    def reset(self, state: TensorDict | None, done) -> TensorDict | None:
        """The state with the envs where ``done`` ([B] bools) start a new episode."""
        if state is None:
            return None
        state = state.clone()
        done = torch.as_tensor(np.asarray(done), dtype=torch.bool, device=self.device)
        state["is_init"] = state["is_init"] | done.reshape(state.batch_size)
        return state

    def act(self, obs, state: TensorDict | None = None, mode: str = "greedy"):
        """``(action, next_state)``; ``mode``: "greedy" (the actor's mode) or "sample"."""
        if mode not in MODES:
            raise ValueError(f"mode: unknown {mode!r}; allowed: {', '.join(MODES)}")
        tensors, batched, as_torch = self._observations(obs)
        batch = next(iter(tensors.values())).shape[0]
        if state is None:
            state = self.initial_state(batch)
        data = TensorDict(
            {**tensors, **state.exclude("is_init"), "is_init": state["is_init"].unsqueeze(-1)},
            batch_size=[batch],
            device=self.device,
        )
        with torch.no_grad(), set_interaction_type(MODES[mode]):
            out = self.module(data)
        action = out["action"]
        next_state = TensorDict(
            state=out["state"],
            belief=out["belief"],
            previous_action=action.float(),
            is_init=torch.zeros(batch, dtype=torch.bool, device=self.device),
            batch_size=[batch],
            device=self.device,
        )
        result = env_action(action, self.spaces)
        if not batched:
            result = result[0]
        if as_torch:
            return result, next_state
        result = result.cpu().numpy()
        return (result.item() if result.ndim == 0 else result), next_state

    def _observations(self, obs) -> tuple[dict[str, torch.Tensor], bool, bool]:
        """Named tensors with a batch dimension; whether one came; whether torch came."""
        keys = self.spaces.obs
        if not isinstance(obs, dict):
            if len(keys) != 1:
                names = ", ".join(key.name for key in keys)
                raise ValueError(f"obs: expected a dict with {names}, got {type(obs).__name__}")
            obs = {keys[0].name: obs}
        as_torch = any(isinstance(value, torch.Tensor) for value in obs.values())
        first, value = keys[0], obs.get(keys[0].name)
        shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
        # a scalar observation's key has shape (1,): one env gives () or (1,), a batch (B,)
        batched = len(shape) > len(first.shape) or (
            first.shape == (1,) and len(shape) == 1 and shape[0] != 1
        )
        tensors = {}
        for key in keys:
            if key.name not in obs:
                raise ValueError(f"obs: missing key {key.name!r}")
            value = obs[key.name]
            value = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
            if value.dtype == torch.float64:
                value = value.float()
            tensors[key.name] = value.to(self.device).reshape(-1, *key.shape)
        return tensors, batched, as_torch
