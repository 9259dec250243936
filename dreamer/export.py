"""The greedy acting policy as one ``torch.export`` file (``.pt2``: encoder, RSSM cell
and actor) that torch alone loads and steps (docs/policy.md has a runnable example).

    python -m dreamer.export run.logdir=<dir> [export.path=FILE] [export.checkpoint=FILE]

    program = torch.export.load("policy.pt2").module()
    action, state, belief, previous_action = program(obs, state, belief, previous_action, is_init)

``obs``: a dict of [B, ...] tensors; ``state``/``belief``/``previous_action``: zeros at
the start, then the previous call's outputs; ``is_init``: [B] bool, True on an episode's
first step. Shapes and dtypes are in the file's ``dreamer.json``. The latent is sampled
from the posterior as in training (seed torch to reproduce a run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dreamer.command_line import parse_args
from dreamer.errors import ConfigError
from dreamer.runtime import rotation, signals

if TYPE_CHECKING:  # torch and torchrl: seconds; a refused command line answers without
    import torch

    from dreamer.serving.policy import Policy

USAGE = (
    "usage: python -m dreamer.export run.logdir=<dir> [export.path=FILE] [export.checkpoint=FILE]"
)
KEYS = ("run.logdir", "export.path", "export.checkpoint")
METADATA = "dreamer.json"
EXAMPLE_BATCH = 2  # not 1: torch.export specialises size-1 dimensions


def example_inputs(policy: Policy, batch: int = EXAMPLE_BATCH) -> tuple:
    import torch

    from dreamer.agent.layout import mask_keys

    masks = mask_keys(policy.spaces.action_heads)
    observations = {}
    for key in policy.spaces.obs:
        if key.name in masks:
            observations[key.name] = torch.ones(batch, *key.shape, dtype=torch.uint8)
        else:
            dtype = torch.uint8 if key.kind == "image" else torch.float32
            observations[key.name] = torch.zeros(batch, *key.shape, dtype=dtype)
    state = policy.initial_state(batch)
    return observations, *(state[key] for key in ("state", "belief", "previous_action", "is_init"))


def specs(tensors: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Each tensor's shape (batch dimension ``B``) and dtype (``getattr(torch, dtype)``)."""
    return {
        name: {"shape": ["B", *value.shape[1:]], "dtype": str(value.dtype).removeprefix("torch.")}
        for name, value in tensors.items()
    }


def metadata(policy: Policy, inputs: tuple, outputs: tuple) -> dict:
    """``dreamer.json``: what the program takes and gives, in call order, as shapes."""
    from dreamer.agent.spaces import spaces_to_dict

    observations, *recurrent = inputs
    return {
        "format": "torch.export",
        "env_step": policy.step,
        "call": "program(obs, state, belief, previous_action, is_init) "
        "-> (action, state, belief, previous_action)",
        "inputs": {
            "obs": specs(observations),
            **specs(dict(zip(("state", "belief", "previous_action", "is_init"), recurrent))),
        },
        "outputs": specs(dict(zip(("action", "state", "belief", "previous_action"), outputs))),
        "spaces": spaces_to_dict(policy.spaces),
    }


def export(policy: Policy, path: Path) -> Path:
    """Export ``policy``'s greedy step to ``path`` (batch size free)."""
    import torch

    step = policy.greedy_step().to("cpu")
    inputs = example_inputs(policy)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    shapes = ({name: {0: batch} for name in inputs[0]}, *({0: batch} for _ in inputs[1:]))
    with torch.no_grad():
        program = torch.export.export(step, inputs, dynamic_shapes=shapes)
        outputs = program.module()(*inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {METADATA: json.dumps(metadata(policy, inputs, outputs), indent=1)}
    torch.export.save(program, str(path), extra_files=extra)
    return path


def main(argv: list[str]) -> int:
    try:
        overrides, _ = parse_args(argv, USAGE, allowed=KEYS, positional="run.logdir")
        values = dict(override.split("=", 1) for override in overrides)
        if not values.get("run.logdir"):
            raise ConfigError("run.logdir: required; " + USAGE)
        logdir = Path(values["run.logdir"])
        found = rotation.find(logdir, values.get("export.checkpoint"))
        from dreamer.serving.policy import Policy  # torch, once a checkpoint is found

        policy = Policy.load(found, device="cpu")
        path = Path(values.get("export.path") or logdir / f"policy-{policy.step:012d}.pt2")
        export(policy, path)
    except (ConfigError, rotation.CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    size = path.stat().st_size
    print(f"exported the greedy policy at env step {policy.step} to {path} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    signals.exit_now(main(sys.argv[1:]))
