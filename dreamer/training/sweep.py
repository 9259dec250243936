"""``python -m dreamer.train -m [hydra/launcher=slurm] key=a,b ...``: a Hydra sweep.

Hydra's multirun expands the overrides into one job per combination and hands the
jobs to its launcher: the basic one runs them here one after another; ``slurm``
(``conf/hydra/launcher/slurm.yaml``, hydra-submitit-launcher) submits one SLURM job
each. A job is the same training as ``python -m dreamer.train <its overrides>``, in
``run.logdir`` = ``<hydra.sweep.dir>/<job number>`` unless the overrides name one.
That directory does not change when SLURM requeues the job, so the requeued job
resumes there: a preemption signal stops the trainer with a checkpoint, and this job
then asks SLURM to requeue it.
"""

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
    """One job of the sweep: ``train_main`` (``dreamer.train.main``) on the config
    Hydra composed for it, in the job's own run directory."""
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
