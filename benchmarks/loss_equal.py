"""The loss against torchrl's (tests/torchrl_reference.py) on this machine's device, as
the learner runs them: losses and gradients of one update through torchrl's stepper, for
each kind of agent, in every precision and capture mode the device has (fp32 eager; on
CUDA also bf16 autocast, and bf16 with the forward/backward captured in a CUDA graph).

    python benchmarks/loss_equal.py [--json PATH]

Each mode reports, per agent, the largest relative error of a loss entry and of a
parameter's gradient (norm of the difference over the norm of the reference's). fp32,
with TF32 off (it rounds matmul inputs to 10 bits): ours against torchrl's, within
``tests/test_fused.py``'s 1e-5. bf16: both against torchrl's fp32 update as the
reference; ours passes when its errors are no larger than torchrl's own bf16 errors (bf16
rounds each path's products differently, so the two bf16 results are not compared with
each other).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dreamer.agent.build import build_agent  # noqa: E402
from dreamer.config import load  # noqa: E402
from dreamer.data.replay import random_batch  # noqa: E402
from tests.batches import MULTI_KEY, real_batch  # noqa: E402
from tests.compare import RTOL, losses_and_gradients, relative_error  # noqa: E402
from tests.torchrl_reference import TorchrlReference  # noqa: E402

AGENTS = {
    "vector_discrete": ["env=cartpole"],
    "vector_continuous": ["env=gym", "env.id=Pendulum-v1"],
    "multi_key": None,  # images and a vector, synthetic
}
TOLERANCE = {"fp32": RTOL}  # bf16: torchrl's own bf16 error against fp32


def modes(device: torch.device) -> list[str]:
    return ["fp32", "bf16", "bf16_cudagraph"] if device.type == "cuda" else ["fp32"]


def one_update(loss, stepped, batch, mode: str) -> tuple[dict, dict]:
    """Loss entries and gradients (fp32) of one update in ``mode``, fixed draws."""
    out, grads, _ = losses_and_gradients(loss, stepped, batch, True, mode)
    losses = {k: v.float() for k, v in out.items() if isinstance(k, str) and k[:5] == "loss_"}
    return losses, {name: grad.float() for name, grad in grads.items()}


def errors(losses: dict, grads: dict, reference: tuple[dict, dict]) -> tuple[float, float]:
    """The largest relative error of a loss entry and of a parameter's gradient."""
    ref_losses, ref_grads = reference
    loss_error = max(
        float((losses[k] - v).abs().max() / v.abs().max().clamp_min(1e-6))
        for k, v in ref_losses.items()
    )
    grad_error = max(relative_error(grads[n], g) for n, g in ref_grads.items())
    return loss_error, grad_error


def compare(kind: str, mode: str, device: torch.device) -> dict:
    overrides = AGENTS[kind]
    cfg = load(["experiment=smoke", "learner.device=cpu", *(overrides or [])])
    if overrides is None:
        spaces, batch = MULTI_KEY, random_batch(MULTI_KEY, cfg.replay.batch, cfg.replay.length)
    else:
        spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    torch.manual_seed(0)
    loss = build_agent(cfg.model, cfg.learner, spaces).loss.to(device)
    batch = batch.to(device)
    reference = TorchrlReference(loss)
    theirs = one_update(loss, reference, batch, mode)
    ours = one_update(loss, loss, batch, mode)
    same_keys = ours[0].keys() == theirs[0].keys() and ours[1].keys() == theirs[1].keys()
    if mode == "fp32":
        loss_error, grad_error = errors(*ours, theirs)
        equal = loss_error <= RTOL and grad_error <= RTOL
        row = {}
    else:  # both against torchrl's fp32 update
        fp32 = one_update(loss, reference, batch, "fp32")
        loss_error, grad_error = errors(*ours, fp32)
        their_loss_error, their_grad_error = errors(*theirs, fp32)
        equal = loss_error <= their_loss_error + 1e-6 and grad_error <= their_grad_error + 1e-6
        row = {"torchrl_loss_rel_error": their_loss_error}
        row["torchrl_grad_rel_error"] = their_grad_error
    return {
        "loss_rel_error": loss_error,
        "grad_rel_error": grad_error,
        **row,
        "same_entries": same_keys,
        "equal": same_keys and equal,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as fp32: the comparison's premise
    torch.backends.cudnn.allow_tf32 = False
    report = {"device": str(device), "tolerance": TOLERANCE, "modes": {}}
    started = time.monotonic()
    for mode in modes(device):
        report["modes"][mode] = {kind: compare(kind, mode, device) for kind in AGENTS}
        for kind, row in report["modes"][mode].items():
            print(
                f"{mode:>15} {kind:>18}: loss {row['loss_rel_error']:.2e}, "
                f"grad {row['grad_rel_error']:.2e}, equal {row['equal']}",
                flush=True,
            )
    report["equal"] = all(r["equal"] for rows in report["modes"].values() for r in rows.values())
    report["seconds"] = round(time.monotonic() - started, 1)
    print("the loss equal to torchrl's in every mode:", report["equal"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
