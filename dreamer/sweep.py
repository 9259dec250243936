"""``python -m dreamer.train -m [hydra/launcher=slurm] key=a,b ...``: a Hydra sweep.

Hydra's multirun expands the overrides into one job per combination and hands the
jobs to its launcher: the basic one runs them here one after another; ``slurm``
(``dreamer/conf/hydra/launcher/slurm.yaml``, hydra-submitit-launcher) submits one SLURM job
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

from dreamer.checkpoint import REQUEUE_EXIT
from dreamer.config import CONF_DIR, register_schema


def job(train_main, _cfg) -> int:
    """One job of the sweep: ``train_main`` (``dreamer.train.main``) on its overrides."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    if not any(override.startswith("run.logdir=") for override in overrides):
        overrides.append(f"run.logdir={Path(hydra.sweep.dir) / str(hydra.job.num)}")
    code = train_main(overrides)
    if code == REQUEUE_EXIT and "SLURM_JOB_ID" in os.environ:
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
    elif code:
        raise SystemExit(code)
    return code


def main(argv: list[str], train_main) -> int:
    import hydra

    register_schema()
    sys.argv = [sys.argv[0], *argv]

    def sweep_job(cfg) -> int:
        return job(train_main, cfg)

    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)(sweep_job)()
    return 0
