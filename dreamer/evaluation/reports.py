"""What the reports show, computed from a model and data and queued on the render pool."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from dreamer.agent.build import Agent, reco_key
from dreamer.envs import registry
from dreamer.runtime.files import jsonl_rows


@torch.no_grad()
def open_loop(
    agent: Agent, batch: TensorDictBase, context: int, image: str
) -> tuple[np.ndarray, np.ndarray]:
    """DreamerV3's open-loop report on replayed windows ``batch`` [B, T]: the posterior
    sees ``context`` observations, then the prior predicts the rest from the real actions.
    Returns (truth, model) uint8 frames, [B, T, H, W, 3] each."""
    world = agent.world_model
    batch = batch.to(next(world.parameters()).device)
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
    model = torch.cat(frames, 1).cpu().float().clamp(0, 1)  # the decoder's [0, 1] images
    return batch.get(("next", image)).cpu().numpy(), (model * 255).round().to(torch.uint8).numpy()


def crafter_score(success_rates: list[float]) -> float:
    """Crafter's score (Hafner 2021): the geometric mean of (1 + s_i) minus 1, over the
    per-achievement success rates s_i in percent."""
    rates = np.asarray(success_rates, np.float64)
    return float(np.exp(np.log1p(rates).mean()) - 1)


def replay_open_loop(
    agent: Agent, replay, image: str | None, length: int
) -> tuple[np.ndarray, np.ndarray, int] | None:
    """The open-loop report's frames for one replayed window: (truth, model, context)."""
    if image is None or not replay.can_sample():
        return None
    context = max(1, length // 4)
    truth, model = open_loop(agent, replay.sample()[:1], context, image)
    return truth[0], model[0], context


def learning_curves(metrics: Path) -> tuple[dict[str, tuple[list, list]], dict[str, str]]:
    """Train episode returns and eval returns vs env steps, read from ``metrics.jsonl``,
    and their legend entries: what each point is and how many episodes are behind it."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    rows = jsonl_rows(metrics)
    for name, key in (("train", "episode/return"), ("eval", "eval/return")):
        points = [(row["env_steps"], row[key]) for row in rows if row.get(key) is not None]
        if points:
            series[name] = tuple(map(list, zip(*points)))
    train = sum(row.get("episode/count", 0) for row in rows if "episode/return" in row)
    evals = [row.get("eval/episodes", 0) for row in rows if "eval/return" in row]
    each = f"{evals[0]} episodes" if evals and len(set(evals)) == 1 else "episodes"
    labels = {
        "train": f"train: {train:,} episodes, a point per log row (their mean)",
        "eval": f"eval: {len(evals)} evaluation{'s' * (len(evals) != 1)}, each the mean of {each}",
    }
    return series, labels


def submit_reports(
    pool, logdir: Path, result, cfg, agent: Agent, replay, image: str | None, under: str = "eval"
):
    """Queue one evaluation's reports under ``<logdir>/<under>/<step>/``: the first
    episode's video, the open-loop predictions, the learning curves, Crafter's rates."""
    folder = report_folder(logdir, result.step, under)
    open_loop_frames = replay_open_loop(agent, replay, image, cfg.replay.length)
    curves, labels = learning_curves(logdir / "metrics.jsonl")
    env = registry.label(cfg.env)
    env = cfg.env.name if env == cfg.env.name else f"{cfg.env.name} {env}"
    if result.frames is not None:
        pool.submit("video", folder / "episode", frames=result.frames)
    if open_loop_frames is not None:
        truth, model, context = open_loop_frames
        pool.submit(
            "open_loop", folder / "open_loop.png", truth=truth, model=model, context=context
        )
    if curves:
        title = f"{env}: returns up to env step {result.step:,}"
        pool.submit("curve", folder / "returns.png", series=curves, title=title, labels=labels)
    if result.achievements:
        score = result.metrics()["eval/crafter_score"]
        episodes = len(result.returns)
        pool.submit(
            "bars",
            folder / "achievements.png",
            names=list(result.achievements),
            values=list(result.achievements.values()),
            title=f"Crafter score {score:.1f}%: evaluation at env step {result.step:,}",
            xlabel=f"% of the evaluation's {episodes} episodes with the achievement",
        )


def report_folder(logdir: Path, step: int, under: str = "eval") -> Path:
    return logdir / under / f"{step:012d}"
