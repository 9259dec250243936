"""The forkserver the collector's env workers, its inference process and the evaluation
process are forked from: what it imports before forking (``forkserver_preload``), and
its start at launch (``start_forkserver``), before the driver imports torch."""

from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.forkserver

from dreamer.envs import registry
from dreamer.runtime.signals import children_keep_signals

COLLECT = "dreamer.data.collect"  # torchrl's collector, the env maker, the acting policy


def forkserver_preload(env_name: str) -> list[str]:
    """What the env workers and the inference process run, imported once by their
    forkserver: the collector's module, the env kind's module, its simulator package and
    what building an env imports from it, pandas where it is installed, then the freeze
    of that heap.

    pandas: tensordict's ``TensorDict.from_any`` imports it (and with it pyarrow) at the
    first dict it converts, which every env worker does at its first steps; imported
    there, after the fork, it cost each of them ~31 MB of private memory."""
    kind = registry.kind(env_name)
    return [
        COLLECT,
        kind.module,
        *([kind.package] if kind.package else []),
        *([kind.preload] if kind.preload else []),
        *(["pandas"] if importlib.util.find_spec("pandas") else []),
        "dreamer.runtime.forkserver_heap",
    ]


def start_forkserver(cfg) -> None:
    """Start the run's forkserver now, importing what its env workers and inference
    process run while this process imports the learner's modules: on two cores each
    takes one, where one after the other they were most of a run's 8 s to its first env
    step. A collector that groups envs (``collector.envs_per_worker > 1``) forks none.
    Started with SIGINT blocked, as every child of the run, and SIGHUP (what a paced
    collection needs of its processes: ``children_keep_signals``); they die with the run.

    The env kind's check comes first (under make, after installing the extra it lacks:
    ``registry.INSTALL_EXTRAS``): it refuses an env the machine cannot run in one line,
    and prepares the environment the workers inherit (DMC's ``MUJOCO_GL``, which
    dm_control reads once, when the forkserver imports it)."""
    kind = registry.kind(cfg.env.name)
    kind.install_extra(cfg.env)
    kind.check(cfg.env)
    if cfg.collector.envs_per_worker > 1:
        return
    # starting a forkserver reads the global start method, which fixes it at Linux's
    # fork where none was set; torchrl starts its own processes (the evaluation's) with
    # that method: fork copied the driver into an evaluation process that outlived a
    # killed driver; spawn imported torch and torchrl anew in it (~3 s of CPU at each
    # run's first evaluation); from this forkserver it finds them imported
    if multiprocessing.get_start_method(allow_none=True) is None:
        multiprocessing.set_start_method("forkserver")
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        forkserver_preload(cfg.env.name)
    )
    with children_keep_signals(stopped=True):
        multiprocessing.forkserver.ensure_running()
