"""learner.compile=true: small compiled graphs that compute what the
eager fused loss computes, and a compile cache a later process reuses."""

import os
import subprocess
import sys

import pytest
import torch

from tests.compare import RTOL, relative_error
from tests.compiled_update import one_update
from tests.runs import ROOT, Trainer


@pytest.mark.slow
def test_a_compiled_update_equals_the_eager_one_and_a_run_loads_it_from_the_cache(tmp_path):
    """One compiled update in a process of its own compiles its graphs into the user's
    cache and computes what the eager update computes; then a run of the same agent
    (``experiment=smoke env=cue``, compiled) says on its screen what its first update
    waits for and loads every graph from that cache, compiling none."""
    cache_home = tmp_path / "cache"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    out = tmp_path / "compiled.pt"
    subprocess.run(
        [sys.executable, "-m", "tests.compiled_update", str(out), "learner.compile=true"],
        cwd=ROOT, env=env, check=True, timeout=600,
    )  # fmt: skip
    compiled = torch.load(out)
    cache = cache_home / "dreamer" / "torch-compile"
    assert any(cache.iterdir()), "the compile cache is in the user cache"
    graphs = compiled["cache"].get("fxgraph_cache_miss", 0)
    assert graphs > 0 and compiled["cache"].get("fxgraph_cache_hit", 0) == 0, compiled["cache"]

    eager = one_update(["learner.compile=false"])
    assert compiled["losses"].keys() == eager["losses"].keys()
    for key, value in eager["losses"].items():
        torch.testing.assert_close(compiled["losses"][key], value, rtol=RTOL, atol=1e-7)
    for name, grad in eager["grads"].items():
        error = relative_error(compiled["grads"][name], grad)
        assert error <= RTOL, (name, float(error))

    # the run: to 160 env steps, ~24 updates from step 64, its speed note after 5 of them
    # (the cache's own counts, in its line: seconds beside the first's would judge a load)
    run = ("experiment=smoke", "env=cue", "learner.compile=true", "run.steps=160")
    trainer = Trainer(tmp_path / "run", *run, "eval.every=0", log=tmp_path / "run.log", env=env)
    assert trainer.wait(300) == 0, trainer.tail()
    lines = trainer.text().splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    start = first("training tiny on cue")
    assert "compiled (RSSM steps)" in lines[start]
    compiling = first("the first update compiles the learner: tens of seconds")
    done = first("the learner compiled in")
    assert start < first("env worker pids") < compiling < done < first("under way")
    assert first("under way") < first("takes")
    assert lines[done].endswith(
        f": 0 graphs compiled, {graphs} loaded from torch's compile cache ({cache})"
    ), lines[done]


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
