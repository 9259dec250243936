"""Worker of ``update.py`` for this project's learner (run in this project's venv).

    .venv/bin/python benchmarks/peers/update_ours.py   # JSON lines on stdin/stdout

``build`` takes ``obs`` (vector | image), ``threads``, ``mode`` (eager | compiled),
``strided`` (images: torchrl's strided CNN, or with false the official-style one),
``batch`` and ``length``: ``experiment=dmc_proprio`` (size1m, the official learner
settings), ``learner.compile`` per mode, on a random batch in the replay's layout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from update_worker import serve, timed, torch_flop_counter, unique_params  # noqa: E402

from dreamer.agent.build import build_agent  # noqa: E402
from dreamer.agent.spaces import EnvSpaces, ObsKey  # noqa: E402
from dreamer.command_line import load  # noqa: E402
from dreamer.data.replay import random_batch  # noqa: E402
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
        if obs == "image":
            self.overrides.append(f"model.cnn_strided={str(strided).lower()}")
        self.spaces = spaces(obs)
        self.batch = random_batch(self.spaces, batch, length)
        cfg = load(
            self.overrides + [f"learner.compile={'true' if mode == 'compiled' else 'false'}"]
        )
        self.learner = self._learner(cfg)
        agent = self.learner.agent
        return {
            "params": {
                "world_model": unique_params(agent.world_model),
                "actor": unique_params(agent.actor),
                "critic": unique_params(agent.value),
                "total": unique_params(self.learner.loss),
            },
            "config": self.overrides + [f"learner.compile={cfg.learner.compile}"],
            "threads": torch.get_num_threads(),
            "versions": {"torch": torch.__version__},
            "optimizer": f"LaProp + AGC {cfg.learner.grad_clip} (torchrl DreamerV3Optimizer), "
            "one optimizer over world model, actor and critic",
            "notes": [],
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
