"""Collection through torchrl's AsyncBatchedCollector, as the trainer wires it: chunking
neither loses, duplicates nor reorders transitions.

The cue env's observations come from its own seeded generator, whatever the actions, so
each worker's stream of observations is known in advance while a real (sampling)
DreamerV3 policy acts."""

import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dreamer.agent.build import latent_sizes
from dreamer.command_line import load
from dreamer.data import collect
from dreamer.data.collect import build_policy, env_seeds, make_collector, path_note
from dreamer.envs.make import make_env, probe_env

ROOT = Path(__file__).resolve().parent.parent
ENVS = 2
FRAMES = 512


def received(chunk: int, **collector) -> dict[int, list[tuple[int, int, int]]]:
    """Per env worker: (step_count, cue shown, next cue) of every transition, in the
    order the driver received them."""
    cfg = load(["experiment=cue", f"run.envs={ENVS}", f"collector.chunk={chunk}"])
    env = OmegaConf.to_container(cfg.env)
    probed = probe_env(env, 0, latent_sizes(cfg.model))
    collector_cfg = OmegaConf.to_container(cfg.collector) | collector
    result = make_collector(
        env=env,
        model=cfg.model,
        spaces=probed.spaces,
        sample=probed.sample,
        policy=build_policy(cfg.model, probed.spaces, 0, torch.get_num_threads()),
        envs=ENVS,
        collector=collector_cfg,
        seed=0,
        replay=None,
        total=FRAMES,
    )
    streams = defaultdict(list)
    try:
        for batch in result:
            batch = batch.reshape(-1)
            for index, step, cue, next_cue in zip(
                batch["env_index"].tolist(),
                batch["next", "step_count"].reshape(-1).tolist(),
                batch["observation"].argmax(-1).tolist(),
                batch["next", "observation"].argmax(-1).tolist(),
            ):
                streams[index].append((step, cue, next_cue))
    finally:
        result.shutdown()
    return dict(streams)


def expected(seed: int, steps: int) -> list[tuple[int, int, int]]:
    """The same env's stream played locally (its actions do not change what it shows)."""
    cfg = load(["experiment=cue"])
    env = make_env(OmegaConf.to_container(cfg.env), seed)
    torch.manual_seed(0)
    rollout = env.rollout(steps, break_when_any_done=False)
    env.close()
    return list(
        zip(
            rollout["next", "step_count"].reshape(-1).tolist(),
            rollout["observation"].argmax(-1).tolist(),
            rollout["next", "observation"].argmax(-1).tolist(),
        )
    )


@pytest.fixture(scope="module")
def chunked():
    return {chunk: received(chunk) for chunk in (1, 64)}


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 64])
def test_each_worker_stream_arrives_whole_and_in_order(chunked, chunk):
    streams = chunked[chunk]
    assert sorted(streams) == list(range(ENVS))
    assert sum(map(len, streams.values())) >= FRAMES
    for index, seed in enumerate(env_seeds(0, 0, ENVS)):
        stream = streams[index]
        assert stream == expected(seed, len(stream)), f"worker {index} (chunk {chunk})"


@pytest.mark.slow
def test_chunk_1_and_chunk_64_deliver_the_same_transitions(chunked):
    for index in range(ENVS):
        common = min(len(chunked[1][index]), len(chunked[64][index]))
        assert common >= FRAMES // ENVS // 2
        assert sorted(chunked[1][index][:common]) == sorted(chunked[64][index][:common])


@pytest.mark.slow
def test_grouped_workers_deliver_every_stream_in_order():
    streams = received(64, envs_per_worker=2)
    for index, seed in enumerate(env_seeds(0, 0, ENVS)):
        assert streams[index] == expected(seed, len(streams[index]))


def test_start_up_note_names_a_cheap_vector_env_on_few_cores(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0, 1})
    note = path_note(has_images=False)
    assert "on 2 cores" in note and "benchmarks/README.md" in note
    # it names what the user can look at, not a collector the trainer does not offer
    assert "time/collect_wait_s" in note and "synchronous" not in note
    assert path_note(has_images=True) is None  # Crafter-like: async wins
    monkeypatch.setattr("os.sched_getaffinity", lambda _: set(range(16)))
    assert path_note(has_images=False) is None


BUILD_AND_STEP = """
import importlib, sys
from omegaconf import OmegaConf
from dreamer.agent.build import latent_sizes
from dreamer.command_line import load
from dreamer.data import collect
from dreamer.data.forkserver import forkserver_preload, import_shared
cfg = load(sys.argv[1:])
env = OmegaConf.to_container(cfg.env)
import_shared()  # what the driver imported before it forked the forkserver
for name in forkserver_preload(cfg.env.name)[:-1]:  # not the heap's freeze
    importlib.import_module(name)
before = {name.split(".")[0] for name in sys.modules}
collect.make_env(env, 0, latent_sizes(cfg.model)).rollout(5)
print(sorted({name.split(".")[0] for name in sys.modules} - before))
"""


@pytest.mark.parametrize(
    "overrides",
    [["experiment=dmc_proprio_cpu", "env.task=cartpole_balance"], ["experiment=atari100k"]],
    ids=["dmc", "atari"],
)
def test_an_env_worker_imports_nothing_its_forkserver_did_not(overrides):
    """A package an env worker imports after its fork is a private copy in each of the
    16 (pandas, through tensordict's ``from_any``, cost each ~31 MB; dm_control.suite's
    scipy and lxml ~13 MB): building and stepping an env after the driver's shared imports
    and the forkserver's preload imports no new top-level package."""
    done = subprocess.run(
        [sys.executable, "-c", BUILD_AND_STEP, *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_runs_forkserver_is_torchrls_start_method_too():
    """torchrl starts the evaluation process with multiprocessing's global start method:
    fork copied the driver into one (which outlived a killed driver); spawn, which
    torchrl's import sets, imported torch and torchrl anew in it. The forkserver's
    children block SIGINT and SIGHUP (the first child, the resource tracker, unblocked
    SIGINT for the rest)."""
    probe = (
        "import multiprocessing, sys\n"
        "from dreamer.command_line import load\n"
        "from dreamer.data.forkserver import start_forkserver\n"
        "import torchrl\n"  # its import sets spawn
        "start_forkserver(load(['env=cue']))\n"
        "from multiprocessing import forkserver\n"
        "pid = forkserver._forkserver._forkserver_pid\n"
        "status = open(f'/proc/{pid}/status').read()\n"
        "blocked = int(status.split('SigBlk:')[1].split()[0], 16)\n"
        "print(multiprocessing.get_start_method(allow_none=True), blocked)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    method, blocked = done.stdout.split()
    assert method == "forkserver"
    for signum in (signal.SIGINT, signal.SIGHUP):  # bit n - 1: signal n
        assert int(blocked) & 1 << (signum - 1), signum


def layout(bank) -> dict:
    return {key: (tuple(value.shape), value.dtype) for key, value in bank.items(True, True)}


@pytest.mark.parametrize("overrides", [["experiment=smoke"], ["experiment=dmc_proprio_cpu"]])
def test_the_slot_layouts_are_those_torchrl_derives_itself(overrides):
    """``slot_transport`` lays out the shared-memory slots from the driver's probe env
    and its own policy; torchrl's ``transport="auto"`` from an env and a policy it builds
    for the purpose: the same keys, shapes and dtypes, pixels or vector, discrete or
    continuous actions."""
    from torchrl.collectors._async_batched import _auto_process_slot_transport

    cfg = load(overrides)
    env = OmegaConf.to_container(cfg.env)
    latent = latent_sizes(cfg.model)
    probed = probe_env(env, 0, latent)
    policy = build_policy(cfg.model, probed.spaces, 0, torch.get_num_threads())
    ours = collect.slot_transport(probed.sample, policy, ENVS)
    theirs, why = _auto_process_slot_transport(
        lambda: make_env(env, 0, latent),
        {},
        policy,
        num_slots=ENVS,
        policy_version_key=collect.POLICY_VERSION,
    )
    assert why is None
    for bank in ("_request_slots", "_response_slots"):
        assert layout(getattr(ours, bank)) == layout(getattr(theirs, bank)), bank
    assert "pixels" in layout(ours._request_slots) or cfg.env.name != "crafter"


def test_a_push_gives_the_served_policy_the_learners_weights_in_one_tensor():
    """A weight push sends the acting policy's weights flat (one tensor per dtype: one
    file descriptor through the driver's resource sharer, not one per tensor); the
    served policy's ``load_policy_weights``, which torchrl's inference process calls,
    puts every value back in its place. Another layout is refused, not half-applied."""
    from tensordict import TensorDict

    from dreamer import torchrl_compat as compat

    cfg = load(["experiment=smoke", "env=cue"])
    env = OmegaConf.to_container(cfg.env)
    spaces = probe_env(env, 0, latent_sizes(cfg.model)).spaces
    learner, served = (build_policy(cfg.model, spaces, seed, threads=1) for seed in (1, 2))
    weights = TensorDict.from_module(learner).detach()
    assert not (TensorDict.from_module(served) == weights).all()
    pushed = compat.flat_weights(weights).share_memory_()
    assert len(list(pushed.values(True, True))) == 1
    served.load_policy_weights(pushed)
    mine = TensorDict.from_module(served)
    assert all(torch.equal(mine.get(name), weights.get(name)) for name in weights.keys(True, True))
    bigger = load(["experiment=smoke", "env=cue", "model=size1m"])
    other = build_policy(bigger.model, spaces, seed=3, threads=1)
    before = TensorDict.from_module(other).clone()
    with pytest.raises(RuntimeError, match="another layout"):
        other.load_policy_weights(pushed)
    assert (TensorDict.from_module(other) == before).all()
