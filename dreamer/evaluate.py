"""Greedy evaluation of a run's latest checkpoint.

    python -m dreamer.evaluate <run.logdir> [episodes]

Rebuilds the agent from the run's ``config.yaml``, loads the latest checkpoint and
plays ``episodes`` episodes in one fresh env with the deterministic (mode) policy;
the command line also writes the reports to ``<run.logdir>/eval/<env step>/``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torchrl.envs.utils import ExplorationType, set_exploration_type

from dreamer import checkpoint
from dreamer.agent.build import build_agent
from dreamer.agent.spaces import spaces_from_env
from dreamer.envs import ACHIEVEMENTS_KEY, env_config, make_env
from dreamer.render import RenderPool, pool_size
from dreamer.replay import SequenceReplay, replay_keys
from dreamer.reports import crafter_score, open_loop

EVAL_SEED_OFFSET = 1_000_000  # eval worlds differ from every training worker's


def evaluate(
    logdir: Path,
    episodes: int = 10,
    max_steps: int = 100_000,
    path: Path | None = None,
    reports: bool = False,
) -> list[float]:
    """Greedy returns of the run's latest checkpoint, or of the checkpoint at ``path``;
    with ``reports``, also writes ``<logdir>/eval/<step>/`` (see ``write_reports``)."""
    found = path or checkpoint.latest(logdir)
    if found is None:
        raise FileNotFoundError(f"run.logdir: no checkpoint in {logdir / 'checkpoints'}")
    cfg = OmegaConf.load(logdir / "config.yaml")
    env_cfg = env_config(OmegaConf.to_container(cfg.env), logdir)
    latent = (cfg.model.stoch * cfg.model.classes, cfg.model.deter)
    env = make_env(env_cfg, cfg.run.seed + EVAL_SEED_OFFSET, latent)
    spaces = spaces_from_env(env)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    state = checkpoint.load(found)
    agent.loss.load_state_dict(state["learner"]["loss"])
    returns, rollouts = [], []
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(episodes):
            rollout = env.rollout(max_steps, agent.policy, break_when_any_done=True)
            returns.append(float(rollout["next", "reward"].sum()))
            rollouts.append(rollout)
    env.close()
    if reports:
        write_reports(logdir, cfg, agent, state, rollouts)
    return returns


def write_reports(logdir: Path, cfg, agent, state: dict, rollouts: list) -> Path:
    """The first episode as a video, the world model's open-loop predictions on replayed
    windows, the training-return curve, and for Crafter the achievement success rates;
    drawn on the render pool (``DREAMER_RENDER_WORKERS``, default 0 here: one file each)."""
    step = state["episodes"]["env_steps"]
    folder = logdir / "eval" / f"{step:012d}"
    pool = RenderPool(pool_size(0))
    image = next((key.name for key in agent.spaces.image_keys), None)
    if image is not None:
        pool.submit("video", folder / "episode", frames=rollouts[0]["next", image].numpy())
        replay = SequenceReplay(
            cfg.replay.size,
            cfg.run.envs,
            min(cfg.replay.batch, 4),
            cfg.replay.length,
            replay_keys([key.name for key in agent.spaces.obs]),
            storage=cfg.replay.get("storage", "memory"),
            directory=logdir / "replay",
        )
        replay.load_state_dict(state["replay"])
        if replay.can_sample():
            context = max(1, cfg.replay.length // 4)
            truth, model = open_loop(agent, replay.sample(), context, image)
            pool.submit(
                "open_loop",
                folder / "open_loop.png",
                truth=truth[0],
                model=model[0],
                context=context,
            )
    metrics = logdir / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )
    train = [(row["env_steps"], row["episode/return"]) for row in rows if "episode/return" in row]
    if train:
        series = {"train episodes": tuple(map(list, zip(*train)))}
        pool.submit("curve", folder / "returns.png", series=series, title=cfg.env.name)
    if ("next", ACHIEVEMENTS_KEY) in rollouts[0].keys(True):
        from dreamer.envs.crafter import ACHIEVEMENTS

        unlocked = torch.stack([r["next", ACHIEVEMENTS_KEY][-1] > 0 for r in rollouts])
        rates = (100 * unlocked.float().mean(0)).tolist()
        pool.submit(
            "bars",
            folder / "achievements.png",
            names=list(ACHIEVEMENTS),
            values=rates,
            title=f"Crafter score {crafter_score(rates):.1f}%",
        )
    pool.close()
    if pool.failures:
        raise RuntimeError(f"reports not written: {pool.failures[0]}")
    return folder


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m dreamer.evaluate <run.logdir> [episodes]", file=sys.stderr)
        return 2
    try:
        episodes = int(argv[1]) if len(argv) > 1 else 10
        returns = evaluate(Path(argv[0]), episodes, reports=True)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"eval return: mean {sum(returns) / len(returns):.1f} over {len(returns)} episodes")
    print(" ".join(f"{value:.1f}" for value in returns))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
