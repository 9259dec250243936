"""Greedy evaluation of a run's latest checkpoint.

    python -m dreamer.evaluate <run.logdir> [episodes]

Rebuilds the agent from the run's ``config.yaml``, loads the latest checkpoint and
plays ``episodes`` episodes in one fresh env with the deterministic (mode) policy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torchrl.envs.utils import ExplorationType, set_exploration_type

from dreamer import checkpoint
from dreamer.agent.build import build_agent
from dreamer.agent.spaces import spaces_from_env
from dreamer.envs import env_config, make_env

EVAL_SEED_OFFSET = 1_000_000  # eval worlds differ from every training worker's


def evaluate(
    logdir: Path, episodes: int = 10, max_steps: int = 100_000, path: Path | None = None
) -> list[float]:
    """Greedy returns of the run's latest checkpoint, or of the checkpoint at ``path``."""
    found = path or checkpoint.latest(logdir)
    if found is None:
        raise FileNotFoundError(f"run.logdir: no checkpoint in {logdir / 'checkpoints'}")
    cfg = OmegaConf.load(logdir / "config.yaml")
    env_cfg = env_config(OmegaConf.to_container(cfg.env), logdir)
    latent = (cfg.model.stoch * cfg.model.classes, cfg.model.deter)
    env = make_env(env_cfg, cfg.run.seed + EVAL_SEED_OFFSET, latent)
    spaces = spaces_from_env(env)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    agent.loss.load_state_dict(checkpoint.load(found)["learner"]["loss"])
    returns = []
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(episodes):
            rollout = env.rollout(max_steps, agent.policy, break_when_any_done=True)
            returns.append(float(rollout["next", "reward"].sum()))
    env.close()
    return returns


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m dreamer.evaluate <run.logdir> [episodes]", file=sys.stderr)
        return 2
    try:
        returns = evaluate(Path(argv[0]), int(argv[1]) if len(argv) > 1 else 10)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"eval return: mean {sum(returns) / len(returns):.1f} over {len(returns)} episodes")
    print(" ".join(f"{value:.1f}" for value in returns))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
