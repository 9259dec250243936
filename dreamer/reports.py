"""What the reports show, computed from a model and plain data (drawing is render.py's)."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from dreamer.agent.build import Agent, reco_key


def _to_uint8(images: torch.Tensor) -> np.ndarray:
    """The decoder's [0, 1] HWC images as uint8."""
    return (images.float().clamp(0, 1) * 255).round().to(torch.uint8).numpy()


@torch.no_grad()
def open_loop(
    agent: Agent, batch: TensorDictBase, context: int, image: str
) -> tuple[np.ndarray, np.ndarray]:
    """DreamerV3's open-loop report for replayed windows ``batch`` [B, T]: the posterior
    follows the first ``context`` observations, then the prior alone predicts the rest
    from the real actions. Returns (truth, model) uint8 frames of shape [B, T, H, W, 3];
    the model's first ``context`` frames are reconstructions, the rest imagined."""
    world = agent.world_model
    rollout, decoder = world.module[1], world.module[2]
    observed = world(batch[:, :context].clone())
    frames = [observed.get(("next", reco_key(image)))]
    state = observed.get(("next", "state"))[:, -1]
    belief = observed.get(("next", "belief"))[:, -1]
    count = batch.shape[0]
    for t in range(context, batch.shape[1]):
        step = TensorDict(
            {"state": state, "belief": belief, "action": batch.get("action")[:, t]}, [count]
        )
        step = rollout.rssm_prior(step)
        state, belief = step.get(("next", "state")), step.get(("next", "belief"))
        decoded = decoder(TensorDict({"next": {"state": state, "belief": belief}}, [count]))
        frames.append(decoded.get(("next", reco_key(image))).unsqueeze(1))
    model = torch.cat(frames, 1)
    return batch.get(("next", image)).numpy(), _to_uint8(model)


def crafter_score(success_rates: list[float]) -> float:
    """Crafter's score (Hafner 2021): the geometric mean of (1 + s_i) minus 1, over the
    per-achievement success rates s_i in percent."""
    rates = np.asarray(success_rates, np.float64)
    return float(np.exp(np.log1p(rates).mean()) - 1)
