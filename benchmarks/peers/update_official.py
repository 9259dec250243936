"""Worker of ``update.py`` for the official DreamerV3 (JAX; run in its own venv).

    .venv-peers/official/bin/python benchmarks/peers/update_official.py SRC
    # SRC: the official source tree (.venv-peers/official/OFFICIAL_SRC); JSON lines

Nothing of the official code is copied here: ``dreamerv3`` and ``embodied`` are imported
from SRC at run time. ``build`` takes ``obs`` (vector | image), ``threads``, ``dtype``
(float32 | bfloat16: ``jax.compute_dtype``), ``batch`` and ``length``; it builds
``dreamerv3.Agent`` from SRC's ``configs.yaml`` (``defaults`` + ``size1m``, ``jax.platform=
cpu``, the profiler off) on fake spaces and a random batch of ``batch x (length +
replay_context)`` steps (the replay context is the first step: it only seeds the latent
state), and compiles its train step. ``update`` is one ``agent.train`` with everything
blocked until ready.

Threads: XLA:CPU runs a compiled step on its own pool, one thread per core the process
may use, whatever ``XLA_FLAGS`` say (``--xla_cpu_multi_thread_eigen=false`` only keeps
each op to one thread; ``intra_op_parallelism_threads=1`` is no XLA flag): measured
here, with those flags two pool threads still shared the work. ``update.py`` therefore
confines every worker (this one and the torch ones alike) to ``threads`` cores with its
CPU affinity, which sizes that pool. For one thread the Eigen flag is still added, by a
wrapper around ``embodied/jax/internal.py setup()`` (which overwrites ``XLA_FLAGS``:
flags from the environment never arrive), after it writes them and before the agent
first touches the backend. ``update`` answers the CPU seconds of each thread, so the
driver can show how many did the work.

FLOPs: the matmuls and convolutions of the compiled step's optimised HLO (2 x multiply-
adds, loop bodies times their trip counts: what torch's FLOP formulas count for the torch
implementations) and, beside it, XLA's own ``cost_analysis()`` of the compiled step (all
ops, but a while loop's body, i.e. each scan, counted once).
"""

from __future__ import annotations

import math
import os
import re
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


HEADER = re.compile(r"^(?:ENTRY )?%?([^ ]+) .*\{$")
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[^ ]+ = (.+?) ([a-z][a-z0-9-]*)\((.*)$")
SHAPE = re.compile(r"[a-z]+[0-9]*\[([0-9,]*)\]")


def _dims(text: str) -> list[int]:
    """The dimensions of the first array shape in ``text``."""
    match = SHAPE.search(text)
    return [int(d) for d in match.group(1).split(",") if d] if match else []


def hlo_matmul_conv_flops(text: str) -> tuple[int, list[str]]:
    """2 x multiply-adds of every dot and convolution that the compiled (optimised) HLO
    module executes: fusions and calls followed, a while loop's body times its known trip
    count, a conditional's costliest branch. Also the loops without a known trip count
    (counted once)."""
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = HEADER.match(line)
        if header and not line.startswith(" "):
            current = computations.setdefault(header.group(1), [])
            entry = header.group(1) if line.startswith("ENTRY") else entry
        elif current is not None and line.strip() and line.strip() != "}":
            current.append(line)
    unknown: list[str] = []
    memo: dict[str, int] = {}

    def called(attrs: str, key: str) -> list[str]:
        match = re.search(key + r"=\{?([^}]*?)\}?(?:, [a-z_]+=|$)", attrs)
        return [name.strip().lstrip("%") for name in match.group(1).split(",")] if match else []

    def cost(name: str) -> int:
        if name in memo:
            return memo[name]
        memo[name] = 0  # no recursion through a computation
        total = 0
        for line in computations.get(name, ()):
            instruction = INSTRUCTION.match(line)
            if not instruction:
                continue
            shape, op, rest = instruction.groups()
            if op == "dot":
                contract = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", rest)
                lhs = _dims(rest)
                inner = math.prod(lhs[int(d)] for d in contract.group(1).split(",") if d)
                total += 2 * math.prod(_dims(shape)) * inner
            elif op == "convolution":
                window = re.search(r"window=\{size=([0-9x]+)", rest)
                labels = re.search(r"dim_labels=[^_]+_([^-]+)->", rest).group(1)
                rhs = [int(d) for d in SHAPE.findall(rest)[1].split(",") if d]
                size = math.prod(int(d) for d in window.group(1).split("x")) if window else 1
                total += 2 * math.prod(_dims(shape)) * size * rhs[labels.index("i")]
            elif op == "while":
                trips = re.search(r'"known_trip_count":\{"n":"([0-9]+)"', rest)
                if not trips:
                    unknown.append(line.strip()[:120])
                body = called(rest, "body")
                total += (int(trips.group(1)) if trips else 1) * sum(cost(b) for b in body)
            elif op == "conditional":
                branches = called(rest, "branch_computations")
                branches += called(rest, "true_computation") + called(rest, "false_computation")
                total += max((cost(b) for b in branches), default=0)
            elif op in ("fusion", "call", "custom-call", "async-start"):
                total += sum(cost(c) for c in called(rest, "calls") + called(rest, "to_apply"))
        memo[name] = total
        return total

    return cost(entry), unknown


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
        world_model = sum(n for k, n in sizes.items() if k.startswith(WORLD_MODEL))
        actor = sum(n for k, n in sizes.items() if k.startswith("pol/"))
        critic = sum(n for k, n in sizes.items() if k.startswith("val/"))
        return {
            "params": {
                "world_model": world_model,
                "actor": actor,
                "critic": critic,
                "total": world_model + actor + critic,
                "slow_critic": sum(n for k, n in sizes.items() if k.startswith("slowval/")),
            },
            "config": [
                "configs.yaml: defaults + size1m",
                "jax.platform=cpu",
                f"jax.compute_dtype={dtype}",
                "jax.prealloc=False",
                "jax.profiler=False",
                f"batch {batch} x {steps} (replay_context {config.replay_context})",
            ],
            "source": str(self.source),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "threads": threads,
            "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__},
            "optimizer": "LaProp-style chain: AGC 0.3 + RMS scaling + momentum (embodied.jax.opt), "
            "one optimizer over world model, actor and critic",
            "cnn": self._cnn(config, params) if obs == "image" else [],
            "notes": notes,
        }

    @staticmethod
    def _cnn(config, params) -> list[str]:
        """The convolution kernels (height, width, in, out) and the CNN settings."""
        kernels = [
            f"{k} {tuple(v.shape)}"
            for k, v in params.items()
            if v.ndim == 4 and k.startswith(("enc/", "dec/"))
        ]
        settings = [
            f"{part}: kernel {config.agent[part].simple.kernel}, strided "
            f"{config.agent[part].simple.strided}"
            for part in ("enc", "dec")
        ]
        return settings + kernels

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
        compiled = self.agent._train
        flops, unknown = hlo_matmul_conv_flops(compiled.as_text())
        xla = compiled.cost_analysis()
        xla = xla[0] if isinstance(xla, (list, tuple)) else xla
        return {
            "flops": flops,
            "xla_cost_analysis_flops": float(xla.get("flops", float("nan"))),
            "loops_without_trip_count": unknown,
            "how": "dots and convolutions of the compiled train step's optimised HLO (2 x "
            "multiply-adds, loop bodies x trip count); xla_cost_analysis_flops: XLA's "
            "cost_analysis() (every op, but a while loop's body counted once)",
        }


if __name__ == "__main__":
    sys.exit(serve(Official(Path(sys.argv[1]))))
