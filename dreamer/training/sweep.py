"""``python -m dreamer.train -m [hydra/launcher=slurm] key=a,b ...``: a Hydra sweep.

One job per combination of the overrides, run here one after another, or one SLURM job
each with ``hydra/launcher=slurm`` (``conf/hydra/launcher/slurm.yaml``). A job trains
as ``python -m dreamer.train <its overrides>`` in ``<hydra.sweep.dir>/<job number>``
unless the overrides name a ``run.logdir``; a job stopped by preemption asks SLURM to
requeue it, and the requeued job resumes in the same directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dreamer.command_line import finish
from dreamer.config import CONF_DIR, register_schema
from dreamer.errors import ConfigError
from dreamer.runtime.signals import REQUEUE_EXIT


def job(train_main, composed) -> int:
    """One sweep job: ``train_main`` on the config Hydra composed, in its own run directory."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    if not any(override.startswith("run.logdir=") for override in overrides):
        with open_dict(composed):
            OmegaConf.update(
                composed, "run.logdir", str(Path(hydra.sweep.dir) / str(hydra.job.num))
            )
    try:
        cfg = finish(composed)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    code = train_main(cfg=cfg)
    if code == REQUEUE_EXIT and "SLURM_JOB_ID" in os.environ:
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
    elif code:
        raise SystemExit(code)
    return code


def main(argv: list[str], train_main) -> int:
    import hydra

    register_schema()
    sys.argv = [sys.argv[0], *argv]

    def sweep_job(composed) -> int:
        return job(train_main, composed)

    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)(sweep_job)()
    return 0
