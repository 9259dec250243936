"""Worker of ``update.py`` for sheeprl's DreamerV3 (run in its own venv).

    .venv-peers/sheeprl/bin/python benchmarks/peers/update_sheeprl.py   # JSON lines

``build`` takes ``obs`` (vector | image), ``threads``, ``batch`` and ``length``. sheeprl's
configuration is composed from its own package (``exp=dreamer_v3_5
algo=dreamer_v3_5_1M``: its copy of the official size1m, replay context 1, imagination
from every replayed state, replay-value loss; ``env=dmc`` with ``state`` or ``rgb`` as
the only key; ``num_threads``); its world model, actor, critic, slow critic, LaProp
optimizer and return moments are built by its ``build_agent`` on a single-CPU Fabric.
``update`` is one call of its ``train`` (``sheeprl/algos/dreamer_v3_5/dreamer_v3_5.py``)
on a random time-first batch of ``(length + 1) x batch`` steps, then the slow critic's
step (``update_target_critic``), as its training loop does; no metric aggregator.
"""

from __future__ import annotations

import sys

from update_worker import conv_layers, serve, timed, torch_flop_counter, unique_params


class Sheeprl:
    def build(self, obs: str, threads: int, batch: int, length: int) -> dict:
        import gymnasium as gym
        import hydra
        import numpy as np
        import sheeprl
        import torch
        from hydra import compose, initialize_config_module
        from lightning.fabric import Fabric
        from omegaconf import OmegaConf
        from sheeprl.algos.dreamer_v3_5 import dreamer_v3_5 as algo
        from sheeprl.algos.dreamer_v3_5.agent import build_agent
        from sheeprl.algos.dreamer_v3_5.utils import Moments
        from sheeprl.utils.utils import dotdict

        torch.set_num_threads(threads)
        key = "rgb" if obs == "image" else "state"
        overrides = [
            "exp=dreamer_v3_5",
            "algo=dreamer_v3_5_1M",
            "env=dmc",
            f"algo.cnn_keys.encoder={[key] if obs == 'image' else []}",
            f"algo.mlp_keys.encoder={[key] if obs == 'vector' else []}",
            f"algo.per_rank_batch_size={batch}",
            f"algo.per_rank_sequence_length={length}",
            f"num_threads={threads}",
            "fabric.accelerator=cpu",
            "fabric.precision=32-true",
        ]
        with initialize_config_module("sheeprl.configs", version_base="1.3"):
            composed = compose("config", overrides=overrides)
        self.cfg = cfg = dotdict(OmegaConf.to_container(composed, resolve=True))
        self.fabric = fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
        fabric.launch()
        if obs == "image":
            space = gym.spaces.Box(0, 255, (3, 64, 64), np.uint8)
        else:
            space = gym.spaces.Box(-np.inf, np.inf, (24,), np.float32)
        self.actions_dim = (6,)
        torch.manual_seed(0)
        world_model, actor, critic, target_critic, _ = build_agent(
            fabric, self.actions_dim, True, cfg, gym.spaces.Dict({key: space})
        )
        self.models = world_model, actor, critic, target_critic
        optimizer = hydra.utils.instantiate(
            cfg.algo.optimizer,
            params=[*world_model.parameters(), *actor.parameters(), *critic.parameters()],
            _convert_="all",
        )
        self.optimizer = fabric.setup_optimizers(optimizer)
        moments = cfg.algo.actor.moments
        self.moments = Moments(
            moments.decay, moments.max, moments.percentile.low, moments.percentile.high
        )
        self.data = self._batch(obs, key, batch, length + cfg.algo.replay_context, cfg)
        self.algo = algo
        return {
            "params": {
                "world_model": unique_params(world_model),
                "actor": unique_params(actor),
                "critic": unique_params(critic),
                "total": unique_params(world_model, actor, critic),
            },
            "config": overrides,
            "threads": torch.get_num_threads(),
            "versions": {"sheeprl": sheeprl.__version__, "torch": torch.__version__},
            "optimizer": f"{cfg.algo.optimizer['_target_'].rsplit('.', 1)[-1]} + AGC "
            f"{cfg.algo.optimizer['agc']}, one optimizer over world model, actor and critic",
            "cnn": conv_layers(world_model) if obs == "image" else [],
            "notes": [],
        }

    @staticmethod
    def _batch(obs: str, key: str, batch: int, steps: int, cfg) -> dict:
        """A random replay sample as its buffer gives it (time first), with the latent
        states of the context step."""
        import torch

        g = torch.Generator().manual_seed(0)
        shape = (steps, batch)
        wm = cfg.algo.world_model
        if obs == "image":
            observation = torch.randint(0, 256, (*shape, 3, 64, 64), generator=g, dtype=torch.uint8)
        else:
            observation = torch.randn(*shape, 24, generator=g)
        last = (torch.rand(*shape, 1, generator=g) < 0.05).float()
        is_first = torch.zeros(*shape, 1)
        is_first[1:] = last[:-1]
        return {
            key: observation,
            "actions": torch.rand(*shape, 6, generator=g) * 2 - 1,
            "rewards": torch.randn(*shape, 1, generator=g),
            "is_first": is_first,
            "terminated": last * (torch.rand(*shape, 1, generator=g) < 0.5).float(),
            "truncated": torch.zeros(*shape, 1),
            "deter": torch.randn(
                *shape, wm.recurrent_model.recurrent_state_size, generator=g
            ).half(),
            "stoch": torch.randint(
                0, wm.discrete_size, (*shape, wm.stochastic_size), generator=g
            ).byte(),
        }

    def _update(self) -> None:
        world_model, actor, critic, target_critic = self.models
        self.algo.train(
            self.fabric, self.cfg, world_model, actor, critic, target_critic,
            self.optimizer, self.moments, dict(self.data), None, self.actions_dim,
        )  # fmt: skip
        self.algo.update_target_critic(critic, target_critic, self.cfg.algo.critic.tau)

    def update(self) -> dict:
        return timed(self._update)

    def flops(self) -> dict:
        with torch_flop_counter() as counter:
            self._update()
        return {"flops": counter.total, "how": "torch.utils.flop_counter formulas, one update"}


if __name__ == "__main__":
    sys.exit(serve(Sheeprl()))
