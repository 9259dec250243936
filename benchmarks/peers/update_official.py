"""Worker of ``update.py`` for the official DreamerV3 (JAX; run in its own venv).

    .venv-peers/official/bin/python benchmarks/peers/update_official.py SRC   # JSON lines

``dreamerv3`` and ``embodied`` are imported from SRC (never copied): ``build`` makes
``dreamerv3.Agent`` from its ``configs.yaml`` (``defaults`` + ``size1m`` on the CPU) on a
random batch and compiles its train step; ``update`` is one ``agent.train``. XLA's pool
has a thread per core the process may use, so ``update.py`` confines the worker's CPU
affinity (one thread: the Eigen flag too). Its FLOPs were counted from the compiled
step's HLO until commit 997ccd0: 29.1 GFLOP per vector update, ours 28.5.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from update_worker import serve, timed

ONE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false"
WORLD_MODEL = ("enc/", "dyn/", "dec/", "rew/", "con/")


def thread_flags(threads: int) -> tuple[str, list[str]]:
    """The XLA flags to add for ``threads`` and what bounds the pool."""
    cores = sorted(os.sched_getaffinity(0))
    notes = [f"CPU affinity {cores}: XLA's pool has {len(cores)} thread(s)"]
    if len(cores) > threads:
        notes.append(f"more cores than the {threads} thread(s) asked for: nothing bounds XLA")
    if threads == 1:
        return ONE_THREAD_FLAGS, notes + [f"XLA_FLAGS += {ONE_THREAD_FLAGS} (after setup())"]
    return "", notes


class Official:
    def __init__(self, source: Path):
        self.source = source
        sys.path.insert(0, str(source))

    def build(self, obs: str, threads: int, dtype: str, batch: int, length: int) -> dict:
        flags, notes = thread_flags(threads)
        import elements
        import embodied.jax.internal as internal
        import jax
        import jaxlib
        import numpy as np
        import ruamel.yaml as yaml
        from dreamerv3.agent import Agent

        setup = internal.setup

        def setup_then_threads(*args, **kwargs):
            setup(*args, **kwargs)  # writes XLA_FLAGS; the backend starts after it
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()

        internal.setup = setup_then_threads
        configs = yaml.YAML(typ="safe").load(
            (self.source / "dreamerv3" / "configs.yaml").read_text()
        )
        config = elements.Config(configs["defaults"]).update(configs["size1m"])
        config = config.update(
            {"jax.platform": "cpu", "jax.compute_dtype": dtype, "jax.prealloc": False}
        )
        jax_options = {**config.jax, "profiler": False, "precompile": False}
        agent_config = elements.Config(
            **config.agent,
            logdir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "dreamerv3-update"),
            seed=0,
            jax=jax_options,
            batch_size=batch,
            batch_length=length,
            replay_context=config.replay_context,
            report_length=config.report_length,
            replica=0,
            replicas=1,
        )
        f32 = np.float32
        obs_space = {
            "reward": elements.Space(f32),
            "is_first": elements.Space(bool),
            "is_last": elements.Space(bool),
            "is_terminal": elements.Space(bool),
        }
        if obs == "image":
            obs_space["image"] = elements.Space(np.uint8, (64, 64, 3))
        else:
            obs_space["observation"] = elements.Space(f32, (24,))
        act_space = {"action": elements.Space(f32, (6,), -1.0, 1.0)}
        self.agent = agent = Agent(obs_space, act_space, agent_config)
        self.jax = jax

        steps = length + config.replay_context
        self.data = internal.device_put(
            self._batch(agent.spaces, batch, steps), agent.train_sharded
        )
        self.carry = agent.init_train(batch)
        self.counter = 0
        params = agent.params
        allo = {k: v for k, v in params.items() if k in agent.policy_keys}
        dona = {k: v for k, v in params.items() if k not in agent.policy_keys}
        seed = agent._seeds(0, agent.train_mirrored)
        agent._train = agent._train.lower(dona, allo, seed, self.carry, self.data).compile()
        sizes = {k: int(v.size) for k, v in params.items()}
        parts = {"world_model": WORLD_MODEL, "actor": "pol/", "critic": "val/"}
        count = {
            part: sum(n for k, n in sizes.items() if k.startswith(p)) for part, p in parts.items()
        }
        total = sum(count.values())
        slow = sum(n for k, n in sizes.items() if k.startswith("slowval/"))
        return {
            "params": count | {"total": total, "slow_critic": slow},
            "config": [
                "configs.yaml: defaults + size1m, jax.platform=cpu, jax.prealloc=False, "
                f"jax.profiler=False, jax.compute_dtype={dtype}",
                f"batch {batch} x {steps} (replay_context {config.replay_context})",
            ],
            "source": str(self.source),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "threads": threads,
            "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__},
            "optimizer": "LaProp-style chain: AGC 0.3 + RMS scaling + momentum (embodied.jax.opt), "
            "one optimizer over world model, actor and critic",
            "notes": notes,
        }

    @staticmethod
    def _batch(spaces, batch: int, steps: int) -> dict:
        """Random values of every space the train step takes (observations, actions, replay
        context entries, step ids); ``consec`` 0: each sequence starts from its context."""
        import numpy as np

        rng = np.random.default_rng(0)
        shape = (batch, steps)
        data = {}
        for key, space in spaces.items():
            full = shape + tuple(space.shape)
            if key == "action":
                data[key] = rng.uniform(-1, 1, full).astype(space.dtype)
            elif space.dtype == np.uint8 and len(space.shape) == 3:
                data[key] = rng.integers(0, 256, full, dtype=np.uint8)
            elif space.dtype == bool:
                data[key] = rng.random(full) < 0.05
            elif np.issubdtype(space.dtype, np.floating):
                data[key] = rng.standard_normal(full).astype(space.dtype)
            else:
                data[key] = np.zeros(full, space.dtype)
        data["is_first"][:, 1:] = data["is_last"][:, :-1]
        data["is_first"][:, 0] = True
        data["is_terminal"] &= data["is_last"]
        return data

    def update(self) -> dict:
        agent, jax = self.agent, self.jax
        self.counter += 1
        seed = agent._seeds(self.counter, agent.train_mirrored)

        def step():
            self.carry, _, _ = agent.train(self.carry, {**self.data, "seed": seed})
            jax.block_until_ready((agent.params, self.carry))

        return timed(step)

    def flops(self) -> dict:
        """XLA's ``cost_analysis()`` of the compiled step, all ops but a scan's body counted
        once: a hint, not the matmul count of torch's formulas (no per-FLOP ratio)."""
        xla = self.agent._train.cost_analysis()
        xla = xla[0] if isinstance(xla, (list, tuple)) else xla
        return {"xla_cost_analysis_flops": float(xla.get("flops", float("nan")))}


if __name__ == "__main__":
    sys.exit(serve(Official(Path(sys.argv[1]))))
