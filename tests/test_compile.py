"""learner.compile=true: small compiled graphs that compute what the
eager fused loss computes, and a compile cache a later process reuses."""

import os
import subprocess
import sys

import pytest
import torch

from tests.compare import RTOL, relative_error
from tests.compiled_update import one_update
from tests.runs import ROOT


@pytest.mark.slow
def test_a_compiled_update_equals_the_eager_one_and_a_new_process_reuses_its_cache(tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    compiled = []
    for attempt in ("cold", "warm"):
        out = tmp_path / f"{attempt}.pt"
        subprocess.run(
            [sys.executable, "-m", "tests.compiled_update", str(out), "learner.compile=true"],
            cwd=ROOT, env=env, check=True, timeout=600,
        )  # fmt: skip
        compiled.append(torch.load(out))
    cold, warm = compiled
    cache = tmp_path / "cache" / "dreamer" / "torch-compile"
    assert any(cache.iterdir()), "the compile cache is in the user cache"
    # the second process loads every compiled graph instead of compiling it again (the
    # cache's own counts: its seconds, beside the first's, would judge it by the load)
    assert cold["cache"].get("fxgraph_cache_miss", 0) > 0, cold["cache"]
    assert warm["cache"].get("fxgraph_cache_miss", 0) == 0, warm["cache"]
    assert warm["cache"]["fxgraph_cache_hit"] == cold["cache"]["fxgraph_cache_miss"]

    eager = one_update(["learner.compile=false"])
    for run in (cold, warm):
        assert run["losses"].keys() == eager["losses"].keys()
        for key, value in eager["losses"].items():
            torch.testing.assert_close(run["losses"][key], value, rtol=RTOL, atol=1e-7)
        for name, grad in eager["grads"].items():
            error = relative_error(run["grads"][name], grad)
            assert error <= RTOL, (name, float(error))


@pytest.mark.parametrize("behavior", [False, True], ids=["cpu_scope", "cuda_scope"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_update_compiles_into_a_fixed_number_of_whole_graphs(behavior, precision):
    """Each compiled function is one graph (``fullgraph``: a break raises), traced once
    for the run's shapes: two updates, and the two RSSM steps (and on CUDA the losses
    after imagination) each compiled exactly once, in either precision (bf16 here under
    the CPU's autocast, emulated where the CPU has no bf16: the trace is the same)."""
    from torch._dynamo.testing import CompileCounter

    from dreamer.agent.build import build_agent
    from dreamer.command_line import load
    from dreamer.data.replay import random_batch
    from dreamer.learning.learner import Learner
    from tests.batches import MULTI_KEY

    torch._dynamo.reset()
    cfg = load(["experiment=smoke", "learner.compile=false"])
    batch = random_batch(MULTI_KEY, cfg.replay.batch, cfg.replay.length)
    torch.manual_seed(0)
    agent = build_agent(cfg.model, cfg.learner, MULTI_KEY)
    learner = Learner(agent, cfg.learner, torch.device("cpu"))
    learner.loss.precision = precision
    counter = CompileCounter()
    learner.loss.compile_steps(behavior=behavior, backend=counter)
    for _ in range(2):
        losses = learner.update(batch.clone())
        assert losses and all(torch.isfinite(value) for value in losses.values())
    assert counter.frame_count == (3 if behavior else 2)
