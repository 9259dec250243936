"""Bytes per stored replay step: what the replay keeps now vs with the acting latents.

    python benchmarks/replay_bytes.py                      # size12m, Crafter
    python benchmarks/replay_bytes.py model=size50m        # any config overrides

Fills the run's replay (``SequenceReplay.from_config``, memory and disk storage) with
``--steps`` transitions of the real env acted by random actions, with the acting
entries the collector delivers (``state``, ``belief`` of the configured model), and
divides the storage's bytes by its slots (now: ``SequenceReplay.row_bytes``, what one
stored transition takes; one-hot actions are stored as indices since issue 37). The
"with acting latents" layout is what the replay kept before issue 17 (``replay_keys``
plus ``state`` and ``belief``).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dreamer.agent.build import latent_sizes
from dreamer.agent.spaces import spaces_from_env
from dreamer.config import load
from dreamer.data.replay import ENV_INDEX, SequenceReplay, action_heads, replay_keys
from dreamer.envs.make import make_env


def bytes_per_slot(replay: SequenceReplay) -> float:
    """Stored bytes per transition (since issue 37 the storage allocates as it fills,
    so per stored step, not per slot of the capacity)."""
    return replay.row_bytes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("overrides", nargs="*", default=[])
    args = parser.parse_args()
    overrides = ["env=crafter", "model=size12m", *args.overrides]
    sized = [*overrides, "run.envs=1", f"replay.size={args.steps}", f"replay.length={args.steps}"]
    cfg = load(sized)
    env = make_env(OmegaConf.to_container(cfg.env), seed=0, latent=latent_sizes(cfg.model))
    spaces = spaces_from_env(env)
    torch.manual_seed(0)
    steps = env.rollout(args.steps, break_when_any_done=False)
    env.close()
    steps.set(ENV_INDEX, torch.zeros(args.steps, dtype=torch.long))
    obs_names = [key.name for key in spaces.obs]
    frame = sum(
        steps.get(("next", name))[0].numel() * steps.get(("next", name)).element_size()
        for name in obs_names
    )
    print(f"{cfg.env.name}, {cfg.model.name}: {args.steps} steps, observation {frame} B per step")
    for storage in ("memory", "disk"):
        cfg = load([*sized, f"replay.storage={storage}"])
        with tempfile.TemporaryDirectory() as directory:
            heads = action_heads(spaces)
            now = SequenceReplay.from_config(cfg, obs_names, Path(directory) / "now", heads=heads)
            before = SequenceReplay.from_config(cfg, obs_names, Path(directory) / "before")
            before.keys = list(dict.fromkeys([*replay_keys(obs_names), "state", "belief"]))
            for replay in (now, before):
                replay.extend(steps)
            old, new = bytes_per_slot(before), bytes_per_slot(now)
            print(
                f"{storage}: with acting latents {old:,.0f} B per step, "
                f"stored now {new:,.0f} B per step ({old / new:.2f}x less)"
            )


if __name__ == "__main__":
    main()
