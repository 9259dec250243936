"""Greedy evaluation of a run's checkpoint, standalone.

    python -m dreamer.evaluate run.logdir=<dir> [eval.episodes=N] [eval.checkpoint=FILE]
                               [eval.envs=N] [eval.max_steps=N] [eval.render_workers=N]

Plays ``eval.episodes`` episodes of the latest (or the named) checkpoint with the mode
policy, as training's periodic evaluation does, and writes the reports to
``<run.logdir>/evaluate/<env step>/``, beside the training run's own ``eval/``."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from dreamer.command_line import check_value, parse_args
from dreamer.errors import ConfigError
from dreamer.runtime import rotation, signals
from dreamer.training.resume import saved

USAGE = (
    "usage: python -m dreamer.evaluate run.logdir=<dir> [eval.episodes=N] "
    "[eval.checkpoint=FILE] [eval.envs=N] [eval.max_steps=N] [eval.render_workers=N]"
)
REPORTS = "evaluate"  # <run.logdir>/evaluate/<step>/: beside training's eval/<step>/
OVERRIDABLE = (
    "run.logdir",
    "eval.episodes",
    "eval.checkpoint",
    "eval.envs",
    "eval.max_steps",
    "eval.render_workers",
)


def evaluate(
    logdir: Path, reports: bool = False, pool=None, serve_forks: bool = False, **eval_overrides
):
    """Greedy episodes of the run's checkpoint (``eval.*`` overrides as keywords, e.g.
    ``episodes=2``): an ``EvalResult``; with ``reports``, also writes them (queued on
    ``pool`` where one is given; its caller closes it). ``serve_forks`` (the command): the
    evaluation and render processes fork from a forkserver forked from this process, as a
    training run's do, instead of new interpreters importing torch again (~3 s each)."""
    from dreamer.data.forkserver import check_env, start_forkserver

    found = rotation.find(logdir, eval_overrides.get("checkpoint"))
    cfg = saved(logdir / "config.yaml")
    cfg.eval = OmegaConf.merge(cfg.eval, eval_overrides)
    if serve_forks:  # before torch: what the forkserver inherits (DMC's MUJOCO_GL)
        check_env(cfg)
    # torch and torchrl: seconds; a command line that names no checkpoint is refused first
    from dreamer.agent.build import build_agent
    from dreamer.data.replay import SequenceReplay, action_heads
    from dreamer.envs.make import describe_env, env_config
    from dreamer.evaluation.render import RenderPool, pool_size
    from dreamer.evaluation.reports import submit_reports
    from dreamer.evaluation.runner import EvalRunner
    from dreamer.runtime import checkpoint

    state = checkpoint.load(found)
    if serve_forks:
        start_forkserver(cfg)
    env = env_config(cfg.env, logdir)
    spaces, achievements = describe_env(env, cfg.run.seed)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    agent.loss.load_state_dict(state["learner"]["loss"])
    step = state["steps"]["env_steps"]
    runner = EvalRunner(cfg, env, spaces, achievements)
    try:
        result = runner.run(step, agent.policy)
    finally:
        runner.shutdown()
    if reports:
        # the checkpoint holds rank 0's replay shard: one stream per env worker of rank 0
        ranks = cfg.run.envs // len(state["replay"]["written"])
        obs_names = [key.name for key in spaces.obs]
        replay = SequenceReplay.from_config(  # read (mapped), never written
            cfg, obs_names, logdir, 0, ranks, heads=action_heads(spaces), readonly=True
        )
        replay.load_state_dict(state["replay"])
        own = pool is None
        pool = RenderPool(pool_size(cfg.eval.render_workers)) if own else pool
        submit_reports(pool, logdir, result, cfg, agent, replay, runner.image, REPORTS)
        if own:
            pool.close()
            if pool.failures:
                raise RuntimeError(f"reports not written: {pool.failures[0]}")
    return result


def main(argv: list[str]) -> int:
    try:
        overrides, _ = parse_args(argv, USAGE, allowed=OVERRIDABLE, positional="run.logdir")
        values = dict(check_value(override) for override in overrides)
        if not values.get("run.logdir"):
            raise ConfigError("run.logdir: required; " + USAGE)
        logdir = Path(values.pop("run.logdir"))
        overrides = {key.split(".", 1)[1]: value for key, value in values.items()}
        rotation.find(logdir, overrides.get("checkpoint"))  # before torch is imported
        result = evaluate(logdir, reports=True, serve_forks=True, **overrides)
    except (ConfigError, rotation.CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from dreamer.evaluation.reports import report_folder

    metrics = result.metrics()
    episodes = metrics["eval/episodes"]
    print(
        f"eval return at env step {result.step}: mean {metrics['eval/return']:.2f} "
        f"over {episodes} episode{'s' if episodes != 1 else ''}"
    )
    print("returns per episode:", " ".join(f"{value:.1f}" for value in result.returns))
    print(f"reports: {report_folder(logdir, result.step, REPORTS)}")
    return 0


if __name__ == "__main__":
    signals.exit_now(main(sys.argv[1:]))
