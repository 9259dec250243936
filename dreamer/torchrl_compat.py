"""Every use of torchrl's private parts, each with why: torchrl is pinned exactly
(``torchrl==0.14.1``) and an upgrade audits this file alone. Names drop torchrl's underscore."""

from __future__ import annotations

import sys

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType
from torchrl.modules.models.model_based import (
    _dreamer_v3_conv_init,
    _dreamer_v3_init,
    _DreamerV3BlockLinear,
    _DreamerV3ChannelRMSNorm,
    _DreamerV3RMSNorm,
    _straight_through_categorical,
)
from torchrl.objectives.dreamer_v3 import _match_trailing_dim, _replay_value_target
from torchrl.weight_update.weight_sync_schemes import WeightStrategy

# -- the DreamerV3 layers and inits our networks use and the loss's scans recognise:
# torchrl exports the networks, not their layers
dreamer_v3_init = _dreamer_v3_init  # the official's truncated-normal init, linear layers
dreamer_v3_conv_init = _dreamer_v3_conv_init  # the same for convolutions
BlockLinear = _DreamerV3BlockLinear  # the block-diagonal GRU layer
ChannelRMSNorm = _DreamerV3ChannelRMSNorm  # RMS norm over a feature map's channels
RMSNorm = _DreamerV3RMSNorm

# -- the loss's pieces computed torchrl's way: equal to its loss (tests/test_fused.py), no copy
straight_through_categorical = _straight_through_categorical  # the RSSM state draw
match_trailing_dim = _match_trailing_dim  # log-prob/entropy shapes against the returns
replay_value_target = _replay_value_target  # the replay-value term's lambda returns


def dist_sample(dist_module, dist) -> torch.Tensor:
    """A draw as torchrl's actor loss makes it: the loss's imagination keeps its random stream."""
    return dist_module._dist_sample(dist, InteractionType.RANDOM)


def return_scale(actor_loss, lambda_target: torch.Tensor) -> torch.Tensor:
    """The actor loss's return normaliser (its percentile statistics updated in place)."""
    return actor_loss._return_scale(lambda_target)


def reduce_loss(value_loss, loss: torch.Tensor) -> torch.Tensor:
    """The value loss's reduction (its ``reduction`` setting) of per-step losses."""
    return value_loss._reduce_loss(loss)


def update_belief(prior, state, belief, action) -> torch.Tensor:
    """One step of the prior's GRU on tensors, without the public forward's TensorDict."""
    return prior._update_belief(state, belief, action)


def distribution_sample(module, distribution, kind) -> torch.Tensor:
    """What tensordict's ``ProbabilisticTensorDictModule`` draws from ``distribution`` for
    interaction type ``kind`` (``rsample`` or ``sample``, its fallbacks), without its
    forward's TensorDict writes and log-probability."""
    return module._dist_sample(distribution, interaction_type=kind)


# -- the collector's parts torchrl builds and does not expose


def collector_server_backend(collector) -> str:
    return collector._server_backend


def inference_server(collector):
    """The collector's inference server: its liveness, and pushes with our own time-out."""
    return collector._server


# Weights for the inference process go to shared memory in the learner's thread: the queue's
# feeder thread would copy them with a parallel op that starts an OpenMP team of its own, and
# past one thread per CPU libgomp ignores the learner's spin (dreamer/runtime/openmp.py).


def push_weights(collector, weights, timeout: float) -> None:
    """``weights`` (read now) into the served policy: flat and shared through the inference
    process's push (within ``timeout``), or copied under a driver server thread's model lock."""
    server = collector._server
    if hasattr(server, "update_model_weights"):
        server.update_model_weights(flat_weights(weights).share_memory_(), timeout=timeout)
    else:

        def copy(model) -> None:
            with torch.no_grad():
                TensorDict.from_module(model).update_(weights)

        server.update_model(copy)


FLAT = "flat"  # the key of a push's one tensor per dtype


def flat_weights(weights: TensorDictBase) -> TensorDict:
    """``weights`` as one tensor per dtype, leaves in sorted-name order: each shared tensor
    pickled costs a resource-sharer connection (35-49 of them: ~80 ms of the driver's loop)."""
    names = sorted(weights.keys(True, True))
    by_dtype: dict[str, list[torch.Tensor]] = {}
    for name in names:
        tensor = weights.get(name)
        by_dtype.setdefault(str(tensor.dtype), []).append(tensor.reshape(-1))
    return TensorDict({FLAT: {dtype: torch.cat(parts) for dtype, parts in by_dtype.items()}})


def load_policy_weights(model: torch.nn.Module, weights: TensorDictBase) -> None:
    """The served policy's side of ``flat_weights`` (torchrl's inference process calls it
    with what a push sent); start weights, sent by name, are applied as torchrl does."""
    if FLAT not in weights.keys():
        device = next(model.parameters()).device
        WeightStrategy(extract_as="tensordict").apply_weights(model, weights.to(device))
        return
    mine = TensorDict.from_module(model)
    targets = [mine.get(name) for name in sorted(mine.keys(True, True))]
    sizes: dict[str, int] = {}
    for target in targets:
        sizes[str(target.dtype)] = sizes.get(str(target.dtype), 0) + target.numel()
    pushed = {dtype: weights.get((FLAT, dtype)).numel() for dtype in weights.get(FLAT).keys()}
    if pushed != sizes:
        raise RuntimeError(f"a weight push of another layout ({pushed}, not {sizes})")
    offsets = dict.fromkeys(sizes, 0)
    with torch.no_grad():
        for target in targets:
            dtype = str(target.dtype)
            start, offsets[dtype] = offsets[dtype], offsets[dtype] + target.numel()
            target.copy_(weights.get((FLAT, dtype))[start : offsets[dtype]].view_as(target))


def share_pending_weights(collector) -> None:
    """Moves the weights torchrl keeps for the starting inference process to shared memory."""
    pending = getattr(collector, "_pending_weights", None)
    if pending is not None:
        pending.share_memory_()


def worker_pids(collector) -> list[int]:
    """The env worker processes: torchrl's own, or with grouped envs those of its
    ``AsyncEnvPool`` (whose list is named ``threads``)."""
    return [worker.pid for worker in env_pool_processes(collector) or collector._workers]


def env_pool_processes(collector) -> list:
    """A grouped collector's env pool processes (``collector.envs_per_worker`` > 1), else []."""
    workers = collector._workers
    if workers and not hasattr(workers[0], "pid"):
        return list(collector._env_pool.threads)
    return []


def fail_collection(collector, error: BaseException) -> None:
    """Make the collector's iterator raise (a ``RuntimeError`` from ``error``) as it does
    for a worker's exception: torchrl watches a grouped collector's driver threads, not its
    pool's processes, so a dead pool process left the iterator waiting for ever (and the
    run, its stop signal unseen, until SIGKILL)."""
    collector._result_queue.put(error)


def inference_server_process(collector):
    """The server's ``multiprocessing.Process`` (None for a server thread in the driver):
    its exit code tells a killed server from one torchrl shut down."""
    return getattr(collector._server, "_process", None)


# -- the Evaluator's process backend: a dead eval process is seen only through these


def evaluator_collector(evaluator):
    return getattr(evaluator._backend, "_collector", None)


def evaluator_thread(evaluator):
    return getattr(evaluator._backend, "_thread", None)


def _frames(thread):
    frame = sys._current_frames().get(thread.ident) if thread is not None else None
    while frame is not None:
        yield frame
        frame = frame.f_back


def evaluator_processes_being_started(evaluator) -> list:
    """The processes of the collector torchrl's evaluator thread is still building: its
    ``MultiCollector.__init__`` holds them until the process has made its env and policy
    (minutes for a slow env), and only then does the evaluator keep the collector."""
    for frame in _frames(evaluator_thread(evaluator)):
        if frame.f_code.co_name == "_run_processes":
            return list(getattr(frame.f_locals.get("self"), "procs", []))
    return []


def waits_for_weight_acknowledgement(thread) -> bool:
    """Is ``thread`` in a weight sync scheme's wait for its receivers' acknowledgement
    (``_wait_for_ack``: no timeout, whether or not the receiver is alive)?"""
    return any(frame.f_code.co_name == "_wait_for_ack" for frame in _frames(thread))


# -- storage


def gym_env(env):
    """The gymnasium env inside torchrl's ``GymWrapper`` (None for another env)."""
    return getattr(env, "_env", None)


def mlflow_logger(resume_id: str | None):
    """torchrl's ``MLFlowLogger``, resuming the MLflow run ``resume_id`` if given: its
    run is started in the private ``_create_experiment``, which has no run-id knob."""
    import mlflow
    from torchrl.record.loggers.mlflow import MLFlowLogger

    class Resumable(MLFlowLogger):
        def _create_experiment(self):
            if resume_id is None:
                return super()._create_experiment()
            run = mlflow.start_run(run_id=resume_id)
            self.id = run.info.experiment_id
            return run

    return Resumable


# -- torchrl's transport and inference server always spawn: each env worker imports torch and
# torchrl anew (~250 MB private memory each); forked from a forkserver, they share those pages


def start_from_forkserver(collector, preload: list[str]) -> None:
    """``collector``'s processes start (at its first iteration) from a forkserver importing
    ``preload``; the slot transport's spawn-context primitives pickle to its children alike."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)
    collector._transport._ctx = context
    collector._server._ctx = context
