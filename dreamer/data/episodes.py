"""Counts env steps and finished episodes from the transitions the driver receives."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from dreamer.envs.make import ACHIEVEMENTS_KEY, RESTART_KEY


class EpisodeStats:
    """The collector's post-collect hook: sees every transition once. ``worker_steps``
    counts this process's env steps since it started (the run's: ``Lockstep.env_steps``)."""

    def __init__(self, achievement_names: tuple[str, ...] = ()):
        self.worker_steps = 0
        self.episodes = 0
        self.restarts = 0  # simulator relaunches by the env adapters
        self.achievement_names = achievement_names
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._unlocked = torch.zeros(len(achievement_names), dtype=torch.long)

    def __call__(self, batch: TensorDictBase) -> None:
        batch = batch.reshape(-1)
        self.worker_steps += batch.numel()
        restarts = batch.get(("next", RESTART_KEY), None)
        if restarts is not None:
            self.restarts += int(restarts.sum())
        done = batch.get(("next", "done")).reshape(-1)
        if not done.any():
            return
        finished = batch[done]
        self.episodes += finished.numel()
        self._returns += finished.get(("next", "episode_reward")).reshape(-1).tolist()
        self._lengths += finished.get(("next", "step_count")).reshape(-1).tolist()
        if self.achievement_names:
            counts = finished.get(("next", ACHIEVEMENTS_KEY)).reshape(finished.numel(), -1)
            self._unlocked += (counts > 0).sum(0)

    def flush(self) -> dict[str, float]:
        """Metrics of the episodes finished since the last flush."""
        metrics: dict[str, float] = {"episode/total": self.episodes, "env/restarts": self.restarts}
        if self._returns:
            metrics["episode/return"] = sum(self._returns) / len(self._returns)
            metrics["episode/length"] = sum(self._lengths) / len(self._lengths)
            metrics["episode/count"] = len(self._returns)
            for name, count in zip(self.achievement_names, self._unlocked.tolist()):
                metrics[f"achievements/{name}"] = count
        self._returns, self._lengths = [], []
        self._unlocked.zero_()
        return metrics

    def state_dict(self) -> dict:
        return {"episodes": self.episodes, "restarts": self.restarts}

    def load_state_dict(self, state: dict) -> None:
        self.episodes = state["episodes"]
        self.restarts = state["restarts"]
