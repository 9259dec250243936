import os
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from dreamer.agent.build import build_agent
from dreamer.command_line import load
from dreamer.envs.make import make_env
from dreamer.errors import ConfigError
from dreamer.learning import learner as learner_module
from dreamer.learning.learner import (
    Learner,
    NonFiniteError,
    cpu_has_bf16,
    describe,
    learner_modes,
)
from tests.batches import real_batch

# bf16 where this CPU computes it (a CPU without it refuses: tested below)
PRECISIONS = ["fp32", "bf16"] if cpu_has_bf16() else ["fp32"]
WORLD_MODEL_TERMS = ("loss_model_reco", "loss_model_reward", "loss_model_continue")


@pytest.fixture(scope="module")
def data():
    """One real cartpole batch, shared: every test clones it before an update."""
    cfg = load(["experiment=smoke", "env=cartpole"])
    return cfg, *real_batch(cfg, cfg.replay.batch, cfg.replay.length)


@pytest.fixture
def setup(data):
    """A fresh learner (seed 0) per test, and the batch."""
    cfg, spaces, batch = data
    torch.manual_seed(0)
    learner = Learner(build_agent(cfg.model, cfg.learner, spaces), cfg.learner, torch.device("cpu"))
    return learner, batch


def test_one_update_changes_every_trained_network(setup):
    learner, batch = setup
    parts = {
        "world_model": learner.agent.world_model,
        "actor": learner.agent.actor,
        "value": learner.agent.value,
    }
    before = {
        name: [p.detach().clone() for p in module.parameters()] for name, module in parts.items()
    }
    metrics = learner.update(batch.clone())
    assert learner.updates == 1
    assert metrics and all(torch.isfinite(v) for v in metrics.values())
    for name, module in parts.items():
        changed = [not torch.equal(p, old) for p, old in zip(module.parameters(), before[name])]
        assert any(changed), f"{name} did not change"


def test_fifty_updates_on_a_fixed_batch_lower_the_world_model_loss(setup):
    learner, batch = setup
    first = learner.update(batch.clone())
    for _ in range(48):
        learner.update(batch.clone())
    last = learner.update(batch.clone())
    before = sum(first[k] for k in WORLD_MODEL_TERMS)
    after = sum(last[k] for k in WORLD_MODEL_TERMS)
    assert after < 0.9 * before, (before, after)


def test_state_dict_round_trip_gives_identical_next_update(setup):
    learner, batch = setup
    cfg = load(["experiment=smoke", "env=cartpole"])
    saved = {k: v for k, v in learner.state_dict().items()}
    saved = torch.utils._pytree.tree_map(
        lambda x: x.clone() if isinstance(x, torch.Tensor) else x, saved
    )
    torch.manual_seed(1)
    twin = Learner(
        build_agent(cfg.model, cfg.learner, learner.agent.spaces), cfg.learner, torch.device("cpu")
    )
    twin.load_state_dict(saved)
    assert twin.updates == learner.updates
    torch.manual_seed(5)
    ours = learner.update(batch.clone())
    torch.manual_seed(5)
    theirs = twin.update(batch.clone())
    assert float(ours["loss_model_reco"]) == pytest.approx(
        float(theirs["loss_model_reco"]), rel=1e-5
    )
    for p, q in zip(learner.loss.parameters(), twin.loss.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_continuous_actions_update_and_act_within_bounds():
    cfg = load(["experiment=smoke", "env=gym", "env.id=Pendulum-v1"])
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    assert not spaces.discrete and spaces.action_dim == 1
    torch.manual_seed(0)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    learner = Learner(agent, cfg.learner, torch.device("cpu"))
    before = [p.detach().clone() for p in agent.actor.parameters()]
    metrics = learner.update(batch.clone())
    assert metrics and all(torch.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(p, q) for p, q in zip(agent.actor.parameters(), before))
    env = make_env(OmegaConf.to_container(cfg.env), seed=1, latent=(16, 64))
    with torch.no_grad():
        rollout = env.rollout(20, agent.policy)
    env.close()
    assert rollout["action"].shape == (20, 1)
    assert torch.isfinite(rollout[("next", "observation")]).all()


def poisoned(batch):
    batch = batch.clone()
    batch.set(("next", "observation"), torch.full_like(batch["next", "observation"], float("nan")))
    return batch


def test_nan_update_is_skipped_counted_and_leaves_the_learner_untouched():
    cfg = load(["experiment=smoke", "env=cartpole"])
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    learner = Learner(build_agent(cfg.model, cfg.learner, spaces), cfg.learner, torch.device("cpu"))
    learner.update(batch.clone())
    state = [t.detach().clone() for t in [*learner.loss.parameters(), *learner.loss.buffers()]]
    learner.update(poisoned(batch))
    assert learner.optimizer.skipped == 1
    after = [*learner.loss.parameters(), *learner.loss.buffers()]
    changed = [i for i, (old, new) in enumerate(zip(state, after)) if not torch.equal(old, new)]
    # only the slow critic's soft target update may move; no parameter and no statistic
    # (a NaN batch is refused before the loss; one whose NaN arises inside: below)
    assert all(torch.isfinite(t).all() for t in after)
    assert not [i for i in changed if i < len(list(learner.loss.parameters()))]
    learner.update(batch.clone())
    assert learner.optimizer.skipped == 1 and learner.optimizer.consecutive_skips == 0


@pytest.mark.parametrize("precision", PRECISIONS)
def test_nan_arising_inside_the_update_is_skipped_not_raised(precision):
    """A finite batch through a world model holding an Inf weight: NaN appears inside
    the update (posterior states, then the actor's logits), which torch's samplers
    would raise on; the update is skipped by the finite check on its gradients."""
    cfg = load(["experiment=smoke", "env=cartpole", f"learner.precision={precision}"])
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    learner = Learner(agent, cfg.learner, torch.device("cpu"))
    for _ in range(3):  # the return statistics move off their initial zeros
        learner.update(batch.clone())
    weight = next(p for p in agent.world_model.parameters() if p.dim() > 1)  # the encoder's
    with torch.no_grad():
        weight[0, 0] = float("inf")
    actor = [p.detach().clone() for p in agent.actor.parameters()]
    statistics = [t.detach().clone() for t in learner._statistics]
    assert any(t.abs().sum() > 0 for t in statistics[:2])  # low, high: moved
    metrics = learner.update(batch.clone())
    assert not torch.isfinite(metrics["loss_model_dynamic"])  # computed, not raised
    assert learner.optimizer.skipped == 1
    assert all(torch.equal(p, q) for p, q in zip(agent.actor.parameters(), actor))
    # the update moved them with NaN returns; the skip put them back
    assert all(map(torch.equal, statistics, learner._statistics)), learner._statistics


def test_persistent_nan_stops_after_max_skips():
    cfg = load(["experiment=smoke", "env=cartpole", "learner.max_skips=2"])
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    learner = Learner(build_agent(cfg.model, cfg.learner, spaces), cfg.learner, torch.device("cpu"))
    learner.update(poisoned(batch))
    learner.update(poisoned(batch))
    with pytest.raises(NonFiniteError, match="max_skips=2"):
        learner.update(poisoned(batch))


@pytest.mark.parametrize(
    ("overrides", "device", "expected"),
    [
        ([], "cpu", {"compile": False, "cudagraph": False, "bf16": False}),
        ([], "cuda", {"compile": True, "cudagraph": True, "bf16": True}),
        (["learner.compile=true"], "cpu", {"compile": True, "cudagraph": False, "bf16": False}),
        (  # the CPU run the README names compiles its update's steps
            ["experiment=dmc_proprio_cpu", "learner.precision=fp32"],
            "cpu",
            {"compile": True, "cudagraph": False, "bf16": False},
        ),
        (
            ["learner.compile=false", "learner.precision=fp32"],
            "cuda",
            {"compile": False, "cudagraph": True, "bf16": False},
        ),
    ],
)
def test_learner_modes_resolve_auto_per_device(overrides, device, expected):
    cfg = load(["learner.device=cpu", *overrides])  # validated as a CPU run
    assert learner_modes(cfg.learner, torch.device(device)) == expected


def test_the_start_line_names_the_precision_and_why(monkeypatch):
    auto, chosen = load(["learner.device=cpu"]).learner, load(["learner.precision=fp32"]).learner
    cuda = learner_modes(auto, torch.device("cuda"))
    assert describe(auto, cuda, torch.device("cuda")) == (
        "bf16 (auto: bf16 on CUDA), compiled (RSSM steps and losses), CUDA graph"
    )
    cpu = learner_modes(auto, torch.device("cpu"))
    for has_bf16, why in ((False, "no bf16 instructions"), (True, "learner.precision=bf16 runs")):
        monkeypatch.setattr(learner_module, "cpu_has_bf16", lambda has=has_bf16: has)
        line = describe(auto, cpu, torch.device("cpu"))
        assert line.startswith("fp32 (auto: ") and why in line and line.endswith(", eager")
    assert describe(chosen, cpu, torch.device("cpu")).startswith("fp32 (learner.precision=fp32)")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="Linux's CPU flags")
def test_bf16_detection_agrees_with_the_kernels_cpu_flags():
    """torch's own detection (``torch.cpu.get_capabilities``) against what Linux says of
    this CPU: an x86 one computes bf16 with avx512_bf16 or AMX bf16, an ARM one with bf16."""
    flags = set(open("/proc/cpuinfo").read().split())
    assert cpu_has_bf16() == bool(flags & {"avx512_bf16", "amx_bf16", "bf16", "svebf16"})


def test_bf16_on_a_cpu_runs_where_the_cpu_has_it_and_is_one_line_where_not(monkeypatch):
    cfg = load(["learner.device=cpu", "learner.precision=bf16"])
    monkeypatch.setattr(learner_module, "cpu_has_bf16", lambda: True)
    assert learner_modes(cfg.learner, torch.device("cpu"))["bf16"]
    monkeypatch.setattr(learner_module, "cpu_has_bf16", lambda: False)
    with pytest.raises(ConfigError, match="learner.precision: bf16 needs a CPU with bf16"):
        learner_modes(cfg.learner, torch.device("cpu"))
    # without it, auto stays fp32 and so does CUDA's explicit fp32
    assert not learner_modes(load(["learner.device=cpu"]).learner, torch.device("cpu"))["bf16"]


ALLOWED = sorted(os.sched_getaffinity(0))


# masks of 1, 2 and 4 cores, as many as this machine has (CI's has 2)
@pytest.mark.parametrize("cores", [c for c in (1, 2, 4) if c <= len(ALLOWED)])
def test_the_learner_takes_half_the_cores_of_its_affinity_mask(cores):
    """``learner.threads=0`` on the CPU: half the cores the process may use (one on 2
    cores, where the env workers and the inference process take the rest); a set
    value is kept."""
    allowed = ALLOWED
    probe = (
        "import torch; from dreamer.learning.learner import learner_threads; "
        "print(learner_threads(0, torch.device('cpu')), learner_threads(3, torch.device('cpu')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, allowed[:cores]),
        env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},  # no cap
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(max(1, cores // 2)), "3"]


KEEP_PROBE = """
import sys, torch
if sys.argv[1] == "learner":
    from dreamer.agent.build import build_agent
    from dreamer.agent.spaces import EnvSpaces, ObsKey
    from dreamer.command_line import load
    from dreamer.learning.learner import Learner
    cfg = load(["experiment=smoke", "env=cartpole"])
    spaces = EnvSpaces((ObsKey("observation", (4,), "vector"),), 2, discrete=True)
    Learner(build_agent(cfg.model, cfg.learner, spaces), cfg.learner, torch.device("cpu"))
def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1])  # pages
block = torch.ones(16 << 20)  # 64 MB, past glibc's largest dynamic mmap threshold
before = resident()
del block
print(before - resident())
"""


@pytest.mark.parametrize(
    ("built", "environment", "kept"),
    [
        ("none", {}, False),  # glibc's default: freed to the kernel, faulted in again
        ("learner", {}, True),
        ("learner", {"MALLOC_TRIM_THRESHOLD_": "131072"}, False),  # the user's setting wins
    ],
)
def test_a_learners_process_keeps_the_memory_an_update_frees(built, environment, kept):
    """A block the size of an update's tensors, freed: in a process with a learner it
    stays in the heap, resident, for the next update's tensors; by default glibc gave it
    back to the kernel, and the next update faulted it in again (a fault per 4 KB page:
    ~56,000 per size1m update). Judged by the pages the free gives back, which no other
    allocation of the process changes: whether the next block lands in the freed one
    depends on what the process allocated between (a 64-byte-aligned request of the same
    size did not fit a freed block that Python had taken a piece of)."""
    done = subprocess.run(
        [sys.executable, "-c", KEEP_PROBE, built],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **environment},
    )
    assert done.returncode == 0, done.stderr
    given_back = int(done.stdout.split()[-1])
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert (given_back < pages // 20) if kept else (given_back > pages // 2), given_back
