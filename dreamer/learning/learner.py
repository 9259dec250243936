"""One DreamerV3 update: loss, optimizer and target update through torchrl's stepper."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import torch
from tensordict import TensorDictBase
from torch._inductor.runtime.runtime_utils import cache_dir, default_cache_dir
from torchrl.trainers.algorithms import DreamerV3OptimizationStepper, DreamerV3Optimizer

from dreamer.agent.build import Agent
from dreamer.errors import ConfigError
from dreamer.runtime.cores import usable_cores
from dreamer.runtime.dist import GradientAverager
from dreamer.runtime.malloc import keep_freed_memory
from dreamer.runtime.world import World

log = logging.getLogger("dreamer")


class NonFiniteError(RuntimeError):
    pass


def _finite(batch: TensorDictBase) -> bool:
    checks = [torch.isfinite(v).all() for v in batch.values(True, True) if v.is_floating_point()]
    return bool(torch.stack(checks).all())


class AveragingSkippingOptimizer(DreamerV3Optimizer):
    """DreamerV3's optimizer that averages the gradients across ranks, then skips a step
    whose gradients hold NaN or Inf: torchrl's stepper calls ``step()`` right after
    backward, outside any captured graph, and every rank judges the same gradients."""

    def __init__(self, *args, average: GradientAverager | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.average = average
        self.skipped = 0
        self.consecutive_skips = 0

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"]]
        if self.average is not None:
            for p in params:  # every rank must reduce the same tensors
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self.average([p.grad for p in params])
        grads = [p.grad for p in params if p.grad is not None]
        if not torch.isfinite(torch.stack(torch._foreach_norm(grads)).sum()):
            self.skipped += 1
            self.consecutive_skips += 1
            return None
        self.consecutive_skips = 0
        return super().step(closure)


def use_compile_cache() -> None:
    """torch.compile's caches in ``$XDG_CACHE_HOME/dreamer/torch-compile``, not /tmp (lost at a
    reboot), unless ``TORCHINDUCTOR_CACHE_DIR`` is set and not torch's default (torchrl sets it)."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or Path(chosen) == Path(default_cache_dir()):
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(base / "dreamer" / "torch-compile")


class CompileNote:
    """Two lines around a compiled learner's first update: what the wait is, then how long
    it took and how many graphs torch compiled or loaded from its compile cache (a second
    run that compiles again has a cache it cannot use: a new torch, or a wiped folder)."""

    def __init__(self, compiling: bool):
        self.before: dict[str, int] | None = None
        self.pending = compiling

    @staticmethod
    def counts() -> dict[str, int]:
        from torch._dynamo.utils import counters  # inductor's own cache hits and misses

        return {key: counters["inductor"][f"fxgraph_cache_{key}"] for key in ("hit", "miss")}

    def before_update(self) -> None:
        if self.pending and self.before is None:
            log.info(
                "the first update compiles the learner: tens of seconds the first time on "
                "this machine, seconds once torch's compile cache holds it"
            )
            self.before = self.counts()

    def after_update(self, seconds: float) -> None:
        if self.pending and self.before is not None:
            self.pending = False
            after = self.counts()
            log.info(
                "the learner compiled in %.1f s: %d graphs compiled, %d loaded from torch's "
                "compile cache (%s)",
                seconds,
                after["miss"] - self.before["miss"],
                after["hit"] - self.before["hit"],
                cache_dir(),  # the folder inductor used, as it names it
            )


CUDA_THREADS = 4  # a GPU learner's host threads only sample replay and launch kernels


def learner_threads(
    configured: int, device: torch.device, paced: bool = False, collectors: int = 0
) -> int:
    """``learner.threads`` resolved; 0: on the CPU every usable core when ``collector.pace``
    yields them, else half (the rest for collection), at most ``OMP_NUM_THREADS``; on CUDA
    what the ``collectors`` processes leave, 1 to ``CUDA_THREADS`` (benchmarks/README.md)."""
    if configured:
        return configured
    if device.type == "cuda":
        return max(1, min(CUDA_THREADS, usable_cores() - collectors))
    threads = usable_cores() if paced else max(1, usable_cores() // 2)
    with contextlib.suppress(ValueError):
        threads = min(threads, max(1, int(os.environ.get("OMP_NUM_THREADS", ""))))
    return threads


def learner_modes(learner_cfg, device: torch.device) -> dict[str, bool]:
    """``learner.compile`` / ``cudagraph`` / ``precision`` for ``device`` (``auto``: on for
    CUDA only); refuses CUDA graphs on a CPU, and bf16 on a CPU without it in hardware."""
    cuda = device.type == "cuda"
    if not cuda and learner_cfg.cudagraph == "true":
        raise ConfigError(
            "learner.cudagraph: CUDA graphs need the learner on CUDA and it runs on the "
            "CPU here; allowed: auto, false"
        )
    if not cuda and learner_cfg.precision == "bf16" and not cpu_has_bf16():
        raise ConfigError(
            "learner.precision: bf16 needs a CPU with bf16 instructions (avx512_bf16 or "
            "amx_bf16) and this one has none; allowed: auto, fp32"
        )

    def tristate(value: str) -> bool:
        return cuda if value == "auto" else value == "true"

    precision = learner_cfg.precision
    return {
        "compile": tristate(learner_cfg.compile),
        "cudagraph": tristate(learner_cfg.cudagraph),
        "bf16": cuda if precision == "auto" else precision == "bf16",
    }


def cpu_has_bf16() -> bool:
    """Whether torch says this CPU has bf16 in hardware (``torch.cpu.get_capabilities``,
    torch >= 2.13; older: no). Elsewhere bf16 is emulated, slower than fp32."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    found = capabilities() if capabilities is not None else {}
    return any(found.get(name) for name in ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16"))


def compiles_losses(device: torch.device) -> bool:
    """Whether ``learner.compile`` also compiles the losses after imagination: CUDA only;
    on a CPU their 38 kernels took 58 s of a 73 s cold compile (size1m) for 8% of an update."""
    return device.type == "cuda"


def describe(learner_cfg, modes: dict[str, bool], device: torch.device) -> str:
    """The update as it runs, for the start line: precision and why, compiled, captured."""
    precision = "bf16" if modes["bf16"] else "fp32"
    if learner_cfg.precision != "auto":
        why = f"learner.precision={learner_cfg.precision}"
    elif device.type == "cuda":
        why = "auto: bf16 on CUDA"
    elif cpu_has_bf16():
        why = "auto: fp32 on a CPU until bf16 is shown to learn as well there; "
        why += "learner.precision=bf16 runs it"
    else:
        why = "auto: this CPU has no bf16 instructions"
    scope = "RSSM steps and losses" if compiles_losses(device) else "RSSM steps"
    compiled = f"compiled ({scope})" if modes["compile"] else "eager"
    captured = ", CUDA graph" if modes["cudagraph"] else ""
    return f"{precision} ({why}), {compiled}{captured}"


class Learner:
    """Data parallel: rank 0's initial weights everywhere, then gradients (and return
    statistics) averaged before every step, so the ranks' weights stay bit-identical."""

    def __init__(self, agent: Agent, learner_cfg, device: torch.device, world: World = World()):
        keep_freed_memory()  # the update's tensors reused, not page-faulted in each update
        self.agent = agent
        self.device = device
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls and convs in TF32
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True  # fixed shapes: the fastest conv, found once
        self.loss = agent.loss.to(device)
        self.max_skips = learner_cfg.max_skips
        self._statistics = [b for name, b in self.loss.named_buffers() if "retnorm" in name]
        world.broadcast_tensors(self.loss.state_dict().values())
        self.optimizer = AveragingSkippingOptimizer(
            self.loss.parameters(),
            lr=learner_cfg.lr,
            agc=learner_cfg.grad_clip,
            warmup_steps=learner_cfg.warmup,
            average=GradientAverager(world, self._statistics) if world.distributed else None,
        )
        self.modes = learner_modes(learner_cfg, device)
        self.loss.precision = "bf16" if self.modes["bf16"] else "fp32"
        if self.modes["compile"]:
            use_compile_cache()
            self.loss.compile_steps(behavior=compiles_losses(device))
        # not the stepper's compile or CUDA-only autocast: the loss does its own, on any device
        self.stepper = DreamerV3OptimizationStepper(
            self.loss,
            self.optimizer,
            agent.target_updater,
            compile_train_step=False,
            cudagraph=self.modes["cudagraph"],
            mixed_precision=False,
        )
        self.updates = 0
        self._warm = not self.modes["cudagraph"]  # the stepper captures in its warm-up

    def update(self, batch: TensorDictBase) -> dict[str, torch.Tensor]:
        """One optimizer step on a [batch, length] replay sample; returns its scalar
        losses as tensors on the learner's device (none for a skipped update)."""
        batch = batch.to(self.device, non_blocking=self.device.type == "cuda")
        if not self._warm:
            self.stepper.warmup(batch)
            self._warm = True
        saved = [buffer.clone() for buffer in self._statistics]
        skipped_before = self.optimizer.skipped
        # a batch with NaN/Inf gives no usable gradient: the update is skipped
        metrics = self.stepper.step(None, batch) if _finite(batch) else None
        if metrics is None:
            self._skip_update()
        if self.optimizer.skipped > skipped_before:
            # a NaN return would poison the return-normalisation statistics forever
            for buffer, value in zip(self._statistics, saved):
                buffer.copy_(value)
        if self.optimizer.consecutive_skips > self.max_skips:
            raise NonFiniteError(
                f"{self.optimizer.consecutive_skips} updates in a row had NaN/Inf gradients "
                f"(learner.max_skips={self.max_skips}); stopping with a checkpoint"
            )
        self.updates += 1
        items = () if metrics is None else metrics.items()
        return {k: v.detach() for k, v in items if isinstance(k, str) and v.numel() == 1}

    def _skip_update(self) -> None:
        """Step with NaN gradients, which the optimizer refuses after the all-reduce, so
        every rank skips this update together; the target network steps as on the others."""
        for parameter in self.loss.parameters():
            if parameter.grad is None:
                parameter.grad = torch.full_like(parameter, float("nan"))
            else:
                parameter.grad.fill_(float("nan"))
        self.optimizer.step()
        if self.agent.target_updater is not None:
            self.agent.target_updater.step()

    def state_dict(self) -> dict:
        return {
            "loss": self.loss.state_dict(),
            "stepper": self.stepper.state_dict(),
            "updates": self.updates,
            "skipped": self.optimizer.skipped,
        }

    def load_state_dict(self, state: dict) -> None:
        self.loss.load_state_dict(state["loss"])
        self.stepper.load_state_dict(state["stepper"])
        self.updates = state["updates"]
        self.optimizer.skipped = state["skipped"]
