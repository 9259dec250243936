"""Greedy evaluation: episodes summarised into ``eval/*`` metrics, and the periodic
evaluation that runs during training on an env process of its own (torchrl's
``Evaluator``, process backend) while the learner goes on."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import numpy as np
from omegaconf import OmegaConf
from tensordict import TensorDictBase
from torchrl.collectors import Evaluator
from torchrl.envs import EnvBase, SerialEnv

from dreamer.agent.build import latent_sizes
from dreamer.agent.spaces import EnvSpaces
from dreamer.collect import build_policy
from dreamer.envs import ACHIEVEMENTS_KEY, make_env
from dreamer.reports import crafter_score

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_000  # eval worlds differ from every training worker's


@dataclass
class EvalResult:
    """What one evaluation saw: per-episode returns and lengths, the first episode's
    frames (for the video) and, for Crafter, each achievement's success rate in %."""

    returns: list[float]
    lengths: list[int]
    frames: np.ndarray | None = None
    achievements: dict[str, float] = field(default_factory=dict)
    step: int = 0

    def metrics(self) -> dict[str, float]:
        returns = np.asarray(self.returns, np.float64)
        metrics = {
            "eval/return": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/length": float(np.mean(self.lengths)),
            "eval/episodes": len(self.returns),
        }
        if self.achievements:
            for name, rate in self.achievements.items():
                metrics[f"eval/achievements/{name}"] = rate
            metrics["eval/crafter_score"] = crafter_score(list(self.achievements.values()))
        return metrics


def summarize(
    episodes: list[TensorDictBase], image: str | None, achievement_names: tuple[str, ...]
) -> EvalResult:
    """``episodes``: one [T] tensordict per finished episode (env units: the return is
    RewardSum's, taken before any reward scaling)."""
    result = EvalResult(
        returns=[float(e.get(("next", "episode_reward"))[-1]) for e in episodes],
        lengths=[int(e.get(("next", "step_count"))[-1]) for e in episodes],
    )
    if image is not None:
        result.frames = episodes[0].get(("next", image)).numpy()
    if achievement_names:
        unlocked = np.stack([e.get(("next", ACHIEVEMENTS_KEY))[-1].numpy() > 0 for e in episodes])
        rates = 100 * unlocked.mean(0)
        result.achievements = dict(zip(achievement_names, rates.tolist()))
    return result


def split_episodes(batch: TensorDictBase) -> list[TensorDictBase]:
    """A collector's flat ("cat") batch of whole trajectories, one tensordict each."""
    ids = batch.get(("collector", "traj_ids")).reshape(-1)
    return [batch[ids == trajectory] for trajectory in ids.unique(sorted=True)]


def make_eval_env(
    env: dict, latent: tuple[int, int], seed: int, count: int, step_cap: int
) -> EnvBase:
    if count == 1:
        return make_env(env, seed, latent, step_cap)
    makers = [functools.partial(make_env, env, seed + i, latent, step_cap) for i in range(count)]
    return SerialEnv(count, makers)


class EvalRunner:
    """Plays ``eval.episodes`` episodes with the mode action, in the background during
    training (``trigger``, then ``poll``) or blocking (``run``, for dreamer.evaluate).

    torchrl's ``Evaluator`` (process backend) owns one child process that builds the
    eval envs and policy itself and receives the learner's weights at each trigger; the
    trajectories come back to this process, where ``summarize`` runs on the Evaluator's
    coordination thread. At most one evaluation is in flight: a trigger while one runs
    is skipped (and logged)."""

    def __init__(
        self,
        *,
        eval_cfg,
        env: dict,
        model: dict,
        learner: dict,
        spaces: EnvSpaces,
        latent: tuple[int, int],
        seed: int,
        achievement_names: tuple[str, ...],
    ):
        self.image = next((key.name for key in spaces.image_keys), None)
        self.achievement_names = achievement_names
        self.timeout = eval_cfg.timeout
        make = functools.partial(
            make_eval_env, env, latent, seed + EVAL_SEED_OFFSET, eval_cfg.envs, eval_cfg.max_steps
        )
        self.evaluator = Evaluator(
            make,
            policy_factory=functools.partial(build_policy, model, learner, spaces, seed, 1),
            num_trajectories=eval_cfg.episodes,
            frames_per_batch=eval_cfg.envs * 100,
            collector_kwargs={"traj_format": "cat"},
            metrics_fn=self._summarize,
            backend="process",
        )
        self.pending_step: int | None = None

    @classmethod
    def from_config(
        cls, cfg, env: dict, spaces: EnvSpaces, achievement_names: tuple[str, ...]
    ) -> EvalRunner:
        """The runner for a run's ``eval.*``, acting with its model (``env``: the env
        node as ``dreamer.envs.env_config`` gives it)."""
        return cls(
            eval_cfg=cfg.eval,
            env=env,
            model=OmegaConf.to_container(cfg.model),
            learner=OmegaConf.to_container(cfg.learner),
            spaces=spaces,
            latent=latent_sizes(cfg.model),
            seed=cfg.run.seed,
            achievement_names=achievement_names,
        )

    def _summarize(self, batch: TensorDictBase) -> dict:
        # torchrl hands what this returns back as "eval/<key>"
        return {"result": summarize(split_episodes(batch), self.image, self.achievement_names)}

    @staticmethod
    def _result(raw: dict) -> EvalResult:
        result: EvalResult = raw["eval/result"]
        result.step = int(raw["eval/step"])
        return result

    def run(self, step: int, policy) -> EvalResult:
        return self._result(self.evaluator.evaluate(policy, step=step))

    def trigger(self, step: int, policy) -> None:
        if self.evaluator.trigger_eval(policy, step=step):
            self.pending_step = step
        else:
            log.warning(
                "eval at env step %d skipped: the one at step %s still runs",
                step,
                self.pending_step,
            )

    def poll(self, timeout: float = 0) -> EvalResult | None:
        """The finished background evaluation's result, if there is one."""
        raw = self.evaluator.poll(timeout)
        if raw is None:
            return None
        self.pending_step = None
        return self._result(raw)

    def finish(self) -> EvalResult | None:
        """Wait up to ``eval.timeout`` s for the evaluation in flight, if any."""
        if self.pending_step is None:
            return None
        log.info("waiting for the evaluation at env step %d", self.pending_step)
        step, result = self.pending_step, self.poll(self.timeout)
        if result is None:
            log.error("the evaluation at env step %d did not finish in %.0f s", step, self.timeout)
        return result

    def shutdown(self) -> None:
        self.evaluator.shutdown()
