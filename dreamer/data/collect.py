"""torchrl ``AsyncBatchedCollector`` wiring: env worker processes reach an inference
process through shared-memory slots and send chunks of transitions straight to replay."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import signal
import threading

import torch
from tensordict import TensorDict
from torchrl.collectors import AsyncBatchedCollector
from torchrl.modules.inference_server import (
    InferenceDeviceConfig,
    InferenceServerConfig,
    ProcessSlotTransport,
)

from dreamer import torchrl_compat as compat
from dreamer.agent.build import build_acting, latent_sizes
from dreamer.agent.spaces import EnvSpaces
from dreamer.data.forkserver import forkserver_preload
from dreamer.envs.make import make_env
from dreamer.errors import ConfigError
from dreamer.runtime.checkpoint import rng_kept
from dreamer.runtime.cores import allowed_cores, usable_cores
from dreamer.runtime.relaunches import Relaunches
from dreamer.runtime.signals import (
    children_keep_signals,
    ctrl_c_after_block,
    die_with_parent,
    stop_moment,
)

log = logging.getLogger(__name__)


POLICY_VERSION = "policy_version"  # torchrl's policy_version_key, left at its default


class CollectorError(RuntimeError):
    pass


def build_policy(model, spaces: EnvSpaces, seed: int, threads: int, device: str = "cpu"):
    """The acting policy, built in the inference process and once in the driver; its weights
    come with the learner's first push, ``seed`` seeds a forked RNG (the caller's stays put).
    ``threads``: torch's default oversubscribes few cores (7 ms -> 100+ ms per forward)."""
    torch.set_num_threads(threads)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = build_acting(model, spaces).to(device)
    policy.load_policy_weights = functools.partial(compat.load_policy_weights, policy)
    return policy


def forked_child(make, *args, **kwargs):
    """``make(*args, **kwargs)``; a forkserver child (not the driver) dies with its parent."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        die_with_parent()
    return make(*args, **kwargs)


def env_seeds(seed: int, rank: int, count: int) -> list[int]:
    return [seed * 10_000 + rank * 1_000 + index for index in range(count)]


def spread_affinity(worker: int) -> list[int]:
    """``collector.worker_affinity=spread``: worker i runs on the i-th allowed core."""
    cores = allowed_cores()
    return [cores[worker % len(cores)]]


def check_machine(collector) -> None:
    """Static-batch inference captures a CUDA graph: it needs a CUDA device."""
    if collector["inference"]["static_batch"] and not torch.cuda.is_available():
        raise ConfigError(
            "collector.inference.static_batch: CUDA-graph inference needs a CUDA device "
            "and none is available; allowed here: false"
        )


def hand_start_weights(collector: AsyncBatchedCollector, policy) -> None:
    """``policy``'s weights, in shared memory, for the inference process's first step."""
    collector.update_policy_weights_(policy)
    compat.share_pending_weights(collector)


def slot_transport(sample: TensorDict, policy, slots: int) -> ProcessSlotTransport:
    """Shared-memory slots laid out from ``sample`` and one pass of ``policy``: torchrl's
    ``transport="auto"`` builds a second env and policy for the same (tests/test_collect.py)."""
    request = sample.select(*policy.in_keys, strict=True).cpu()
    device = next(policy.parameters()).device
    with torch.no_grad(), rng_kept():  # a sampling policy draws from the driver's RNG
        output = policy(request.clone().unsqueeze(0).to(device)).squeeze(0)
    response = output.select(*policy.out_keys, strict=True).cpu()
    response.set(POLICY_VERSION, torch.zeros(response.batch_size, dtype=torch.long))
    return ProcessSlotTransport(request, response, num_slots=slots)


def make_collector(
    *,
    env,
    model,
    spaces: EnvSpaces,
    sample: TensorDict,
    policy,
    envs: int,
    collector,
    seed: int,
    replay,
    total: int = -1,
    rank: int = 0,
    gpu: str = "cuda",
) -> AsyncBatchedCollector:
    """``env``, ``model``, ``collector``: config nodes; ``sample``: ``probe_env``'s; ``policy``:
    this process's acting one; ``rank`` picks env seeds, ``gpu`` static-batch inference's."""
    grouped = collector["envs_per_worker"] > 1
    latent = latent_sizes(model)
    # factories torchrl calls in the processes it starts (a forkserver's children), or in this
    # one (grouped workers' policy: a thread of the driver)
    env_fns = [
        functools.partial(forked_child, make_env, env, env_seed, latent)
        for env_seed in env_seeds(seed, rank, envs)
    ]
    inference = collector["inference"]
    max_batch = inference["max_batch"] or envs
    static = max_batch if inference["static_batch"] else None
    policy_device = gpu if static else "cpu"  # CUDA-graph capture needs the policy there
    transport = None if grouped else slot_transport(sample, policy, envs)
    result = AsyncBatchedCollector(
        env_fns,
        policy_factory=functools.partial(
            forked_child, build_policy, model, spaces, seed, collector["threads"], policy_device
        ),
        frames_per_batch=collector["chunk"] * envs,
        total_frames=total,
        env_backend="multiprocessing",
        transport=transport or "driver",  # grouped: served from a thread of this process
        envs_per_worker=collector["envs_per_worker"],
        transition_chunk_size="auto" if grouped else collector["chunk"],
        server_config=InferenceServerConfig(
            max_batch_size=max_batch,
            min_batch_size=inference["min_batch"],
            timeout=inference["timeout"],
            static_batch_size=static,
        ),
        device_config=InferenceDeviceConfig(
            policy_device=policy_device, output_device="cpu", storing_device="cpu"
        )
        if static
        else None,
        worker_affinity=spread_affinity if collector["worker_affinity"] == "spread" else None,
        replay_buffer=replay,
    )
    if not grouped:  # env workers forked from one process that imported what they run
        compat.start_from_forkserver(result, forkserver_preload(env["name"]))
    log.info(
        "collector: %d envs in %d process workers, transport=%s, server=%s, chunk=%s, "
        "inference batch %d..%d (timeout %.3g s%s), worker affinity %s",
        envs,
        envs // collector["envs_per_worker"],
        type(transport).__name__ if transport else "driver",
        compat.collector_server_backend(result),
        "auto (grouped workers)" if grouped else collector["chunk"],
        inference["min_batch"],
        max_batch,
        inference["timeout"],
        f", static CUDA graph at {static}" if static else "",
        collector["worker_affinity"],
    )
    return result


FEW_CORES = 4  # up to here the async path loses on cheap envs (benchmarks/README.md)


def path_note(has_images: bool) -> str | None:
    """Where the collector's round trip costs more than a cheap vector env's step on few
    cores, say so and how to tell whether it limits this run."""
    cores = usable_cores()
    if has_images or cores > FEW_CORES:
        return None
    return (
        f"collector: a vector-only env on {cores} cores: each step's round trip through "
        "the env worker and inference processes costs more than the env itself "
        '(benchmarks/README.md, "Collection throughput"); at DreamerV3\'s train ratios '
        "the learner usually sets the pace: time/collect_wait_s in the metrics shows "
        "whether collection limits this run"
    )


def pace_mode(configured: str, cpu_learner: bool) -> str:
    """``collector.pace`` resolved. ``auto``: ``stop`` where a CPU learner shares few cores
    with the collection, else ``none`` (collection overlaps the update)."""
    if configured != "auto":
        return configured
    return "stop" if cpu_learner and usable_cores() <= FEW_CORES else "none"


NICE = 19  # the lowest CPU priority: a paced collection runs only where the learner idles


def stopped(pid: int) -> bool:
    """Stopped by a signal (state T in /proc): by us, a debugger or a test."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


def lower_priority(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, NICE)
        except OSError as error:  # gone meanwhile: its collector is being replaced
            log.debug("collector pace: process %d kept its priority (%s)", pid, error)


DONE = object()


class PoolWatch:
    """Calls ``died(error)`` once one of ``processes`` has exited, looking every
    ``interval`` s from a thread of its own (none for no processes)."""

    def __init__(self, processes: list, died, interval: float = 0.5):
        self._ended = threading.Event()
        self._thread = None
        if processes:
            self._thread = threading.Thread(
                target=self._watch, args=(processes, died, interval), daemon=True
            )
            self._thread.start()

    def _watch(self, processes: list, died, interval: float) -> None:
        while not self._ended.wait(interval):
            if dead := [process for process in processes if process.exitcode is not None]:
                exits = ", ".join(f"pid {p.pid} (exit code {p.exitcode})" for p in dead)
                died(RuntimeError(f"env pool process died: {exits}"))
                return

    def stop(self) -> None:
        self._ended.set()
        if self._thread is not None:
            self._thread.join()


class SelfHealingCollector:
    """Iterates a collector, and replaces it when it fails: torchrl raises when an env worker
    or the inference process dies but cannot replace one, so ``make(replacements)`` rebuilds
    it whole (undelivered transitions are lost). ``max_failures`` in a row re-raise."""

    def __init__(
        self,
        make,
        max_failures: int = 3,
        relaunches: Relaunches | None = None,
        pace: str = "none",
    ):
        self._make = make
        self.max_failures = max_failures
        self.pace = pace  # resolved ``collector.pace``: nice, pause or none
        self.relaunches = relaunches if relaunches is not None else Relaunches()
        self.replacements = 0
        self.earlier_versions = 0  # weight pushes to earlier collectors (and earlier runs)
        self.current = None
        self.pids: list[int] = []  # the current collector's env workers and inference process
        self.held: list[int] = []  # those pace=stop has stopped now
        self.deferred = None  # a weight push due while they were stopped: (policy, timeout)
        self.watch = PoolWatch([], None)  # a grouped collector's pool, while it is iterated

    def start(self) -> None:
        self.current = self._make(self.replacements)

    @property
    def policy_version(self) -> int:
        """Weight pushes over the whole run, across replacements and resumes."""
        return self.earlier_versions + (self.current.policy_version if self.current else 0)

    def state_dict(self) -> dict:
        return {"policy_version": self.policy_version}

    def load_state_dict(self, state: dict) -> None:
        self.earlier_versions = state["policy_version"]

    def push(self, policy, timeout: float) -> None:
        """The policy's weights to the inference process, waiting at most ``timeout`` s (not
        ``update_policy_weights_``: it waits 300 s for a stopped process); deferred to
        ``resume`` while ``pace=stop`` holds the process."""
        if self.held:
            self.deferred = (policy, timeout)
            return
        try:
            compat.push_weights(self.current, TensorDict.from_module(policy).detach(), timeout)
        except TimeoutError as error:
            log.warning(
                "weight push: %s (waited %.0f s); the policy keeps its weights until the next push",
                error,
                timeout,
            )
        except RuntimeError as error:
            if self.current is not None and compat.inference_server(self.current).is_alive:
                raise
            log.warning("weight push failed, the inference server is gone: %s", error)

    def __iter__(self):
        failures = 0
        while True:
            collector, server = self.current, None
            try:
                batches = iter(collector)
                # torchrl starts its processes here; Ctrl-C waits for the first batch (raised in
                # that start, it broke the shutdown: exit 1, no checkpoint); a second raises at once
                with ctrl_c_after_block(), children_keep_signals(stopped=self.pace == "stop"):
                    stop_moment("collector_start")
                    first = next(batches, DONE)  # batches are None: they went to replay
                if first is DONE:
                    return
                pids = compat.worker_pids(collector)
                log.info("env worker pids: %s", " ".join(map(str, pids)))
                server = compat.inference_server_process(collector)
                if server is not None:
                    log.info("inference server pid: %s", server.pid)
                self.pids = pids + ([server.pid] if server is not None else [])
                if self.pace == "nice":
                    lower_priority(self.pids)
                # torchrl sees a dead pool process only while its thread waits for results
                self.watch = PoolWatch(
                    compat.env_pool_processes(collector),
                    functools.partial(compat.fail_collection, collector),
                )
                try:
                    for batch in itertools.chain([first], batches):
                        failures = 0
                        yield batch
                finally:
                    self.watch.stop()
                return
            except RuntimeError as error:
                failures += 1
                cause = error.__cause__ or error
                if failures > self.max_failures:
                    last = f"{error}: {cause}" if cause is not error else str(error)
                    raise CollectorError(
                        f"collection failed {failures} times in a row; last: {last}"
                    ) from error
                # torchrl has shut both down (our server reference was taken at start): a
                # server it stopped exits 0 or by SIGTERM, a killed or crashed one otherwise
                server_died = server is not None and server.exitcode not in (
                    None,
                    0,
                    -signal.SIGTERM,
                )
                self.relaunches.replacing(
                    "inference" if server_died else None,
                    f"collection failed ({error}: {cause})"
                    + (" after its inference server died" if server_died else ""),
                    "the collector",
                )
                self.replacements += 1
                self.earlier_versions += collector.policy_version
                self.pids = []
                collector.shutdown()
                self.current = self._make(self.replacements)

    @contextlib.contextmanager
    def paced(self, active: bool = True):
        """The block (an update burst, when ``active``) with collection paced: ``stop`` SIGSTOPs
        its processes until it ends (one already stopped stays so); ``pause`` parks them with
        torchrl's ``pause`` (waking every 10 ms), not at all where a worker died."""
        if active and self.pace == "stop" and self.pids:
            try:
                for pid in self.pids:
                    if not stopped(pid):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGSTOP)
                            self.held.append(pid)
                yield
            finally:
                self.resume()
            return
        if not active or self.pace != "pause" or self.current is None:
            yield
            return
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.current.pause(timeout=30.0))
            except (RuntimeError, TimeoutError) as error:
                log.debug("collector pace: not paused (%s)", error)
            yield

    def resume(self) -> None:
        """Continue what ``pace=stop`` stopped, then push the weights deferred meanwhile."""
        held, self.held = self.held, []
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.deferred is not None:
            deferred, self.deferred = self.deferred, None
            self.push(*deferred)

    def shutdown(self) -> None:
        self.held, self.deferred = [], None  # (paced's exit has continued them)
        self.watch.stop()
        if self.current is not None:
            self.current.shutdown()
