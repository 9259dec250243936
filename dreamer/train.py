"""``python -m dreamer.train [overrides]``: the command line, the env and the trackers
checked (no torch yet: ``--help`` and a bad override answer at once), then the run
(``dreamer.training.loop``) with the collector's forkserver forked from this process
once it has imported torch and torchrl."""

from __future__ import annotations

# before anything imports torch: libgomp reads its settings when torch loads it
from dreamer.runtime.openmp import choose_wait_policy

choose_wait_policy()

import sys

from omegaconf import DictConfig, OmegaConf

from dreamer.command_line import load, parse_args, validated
from dreamer.config import check_trackers
from dreamer.data.forkserver import check_env, start_forkserver
from dreamer.errors import ConfigError
from dreamer.key_reference import usage
from dreamer.runtime import signals
from dreamer.training.resume import resolved_logdir, resumed, with_logdir


def main(argv: list[str] | None = None, build=None, cfg: DictConfig | None = None) -> int:
    """``loop.run``'s exit code (2 for an env this machine cannot run); ``build``: the
    run's parts (default ``dreamer.training.parts.build_parts``)."""
    argv = sys.argv[1:] if argv is None else argv
    signals.claim_stop_moment()
    if cfg is None:  # a sweep's job passes the config its launcher composed
        cfg = from_argv(argv)
    try:
        check_env(cfg)
        check_trackers(cfg.logger.use)
    except ConfigError as e:  # the env this machine cannot run, a tracker not installed
        print(f"error: {e}", file=sys.stderr)
        return 2
    from dreamer.training import loop  # torch, torchrl: seconds

    start_forkserver(cfg)  # forked from this process, which has imported them now
    return loop.run(argv, cfg, build)


def from_argv(argv: list[str]) -> DictConfig:
    """The command line: overrides plus ``--cfg job`` / ``-h``; user errors exit 2."""
    try:
        overrides, show = parse_args(argv, usage, cfg_flag=True)  # usage(): --help only
        cfg = validated(resumed(load(overrides, check=False), overrides))  # a resume's: its run's
        if show:  # as the run would save it: with the folder it would write to
            print(OmegaConf.to_yaml(with_logdir(cfg, resolved_logdir(cfg))), end="")
            sys.exit(0)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return cfg


def cli() -> int:
    if {"-m", "--multirun"} & set(sys.argv[1:]):  # a sweep: Hydra runs main() per job
        from dreamer.training import sweep

        return sweep.main(sys.argv[1:], main)
    try:
        with signals.terminal_job():
            return main()
    except KeyboardInterrupt:  # the run said where it stopped and how to resume it
        return signals.INTERRUPT_EXIT


if __name__ == "__main__":
    signals.exit_now(cli())
