"""Worker of ``update.py`` for this project's learner (run in this project's venv).

    .venv/bin/python benchmarks/peers/update_ours.py   # JSON lines on stdin/stdout

``build`` takes ``obs`` (vector | image), ``threads``, ``mode`` (eager | compiled),
``strided`` (image CNN: torchrl's strided one, or with false the official-style one of
``model.cnn_strided=false`` where the config has it), ``batch`` and ``length``. The
learner is the one ``benchmarks/learner.py`` times: ``experiment=dmc_proprio`` (size1m,
the official learner settings: imagination of 15 steps from every replayed state,
replay-value loss), ``learner.compile`` per mode, on a
synthetic batch (``tests/batches.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from update_worker import conv_layers, serve, timed, torch_flop_counter, unique_params  # noqa: E402

from dreamer.agent.build import build_agent  # noqa: E402
from dreamer.agent.spaces import EnvSpaces, ObsKey  # noqa: E402
from dreamer.config import load  # noqa: E402
from dreamer.data.replay import random_batch  # noqa: E402
from dreamer.errors import ConfigError  # noqa: E402
from dreamer.learning.learner import Learner  # noqa: E402

CPU = torch.device("cpu")


def spaces(obs: str) -> EnvSpaces:
    """DMC walker: a 24-dim proprio vector or a 64x64 RGB image; 6 actions in [-1, 1]."""
    key = (
        ObsKey("image", (64, 64, 3), "image")
        if obs == "image"
        else ObsKey("observation", (24,), "vector")
    )
    return EnvSpaces((key,), 6, discrete=False)


class Ours:
    def build(
        self, obs: str, threads: int, mode: str, strided: bool, batch: int, length: int
    ) -> dict:
        torch.set_num_threads(threads)
        self.overrides = ["experiment=dmc_proprio"]
        self.overrides += [f"replay.batch={batch}", f"replay.length={length}"]
        notes = []
        if obs == "image":
            try:
                load(self.overrides + [f"model.cnn_strided={str(strided).lower()}"])
                self.overrides.append(f"model.cnn_strided={str(strided).lower()}")
            except ConfigError as error:
                if not strided:
                    raise RuntimeError(f"no official-style CNN in this tree ({error})") from None
                notes.append("model.cnn_strided not in the config: torchrl's strided CNN")
        self.spaces = spaces(obs)
        self.batch = random_batch(self.spaces, batch, length)
        cfg = load(
            self.overrides + [f"learner.compile={'true' if mode == 'compiled' else 'false'}"]
        )
        self.learner = self._learner(cfg)
        agent = self.learner.agent
        world_model = unique_params(agent.world_model)
        actor, critic = unique_params(agent.actor), unique_params(agent.value)
        total = unique_params(self.learner.loss)
        return {
            "params": {
                "world_model": world_model,
                "actor": actor,
                "critic": critic,
                "total": total,
            },
            "config": self.overrides + [f"learner.compile={cfg.learner.compile}"],
            "threads": torch.get_num_threads(),
            "versions": {"torch": torch.__version__},
            "optimizer": f"LaProp + AGC {cfg.learner.grad_clip} (torchrl DreamerV3Optimizer), "
            "one optimizer over world model, actor and critic",
            "cnn": conv_layers(agent.world_model) if obs == "image" else [],
            "notes": notes,
        }

    def _learner(self, cfg) -> Learner:
        torch.manual_seed(0)
        return Learner(build_agent(cfg.model, cfg.learner, self.spaces), cfg.learner, CPU)

    def update(self) -> dict:
        return timed(lambda: self.learner.update(self.batch))

    def flops(self) -> dict:
        """One update of a fresh eager learner under torch's FLOP formulas (a compiled one
        executes the same operations)."""
        eager = self._learner(load(self.overrides + ["learner.compile=false"]))
        with torch_flop_counter() as counter:
            eager.update(self.batch)
        return {"flops": counter.total, "how": "torch.utils.flop_counter formulas, eager update"}


if __name__ == "__main__":
    sys.exit(serve(Ours()))
