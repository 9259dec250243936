"""``run.from_checkpoint``: a new run that starts from another run's weights, of the
``run.from_checkpoint_parts``: ``world_model``, ``actor`` (with its return-normalisation
statistics), ``critic`` (with the slow critic), ``optimizer`` (needs all three). Counters,
replay and the schedule start fresh; another layout or model size is a ``ConfigError``."""

from __future__ import annotations

import logging

from dreamer.agent.build import Agent
from dreamer.agent.spaces import EnvSpaces, layout_difference, spaces_from_dict
from dreamer.config import WARM_START_PARTS
from dreamer.errors import ConfigError
from dreamer.runtime import checkpoint, rotation

log = logging.getLogger(__name__)


def _owners(agent: Agent) -> dict[str, str]:
    """Loss state-dict name -> the part that owns it (config-derived constants left out)."""
    parts = {"world_model": agent.world_model, "actor": agent.actor, "critic": agent.value}
    owners = {name: part for part, m in parts.items() for name in agent.loss_names(m).values()}
    for name in agent.loss.state_dict(keep_vars=True):
        if "target_value" in name:  # the slow critic: a copy, not the critic's tensors
            owners[name] = "critic"
        elif "retnorm" in name:
            owners[name] = "actor"
    return owners


def _check_source(state: dict, model, spaces: EnvSpaces, path) -> None:
    source = state["config"]["model"]
    for key, value in source.items():
        if key != "name" and model.get(key, value) != value:
            raise ConfigError(
                f"run.from_checkpoint: {path} has another model: model.{key} "
                f"{value} there, {model.get(key)} here"
            )
    difference = layout_difference(spaces_from_dict(state["spaces"]), spaces)
    if difference:
        raise ConfigError(
            f"run.from_checkpoint: {path} was trained on another env layout: {difference}"
        )


def warm_start(learner, agent: Agent, spaces: EnvSpaces, model: dict, path, parts) -> None:
    """Load ``parts`` of the checkpoint at ``path`` (a file or a run directory) into
    ``learner``'s agent; ``model``: this run's model config node as a dict."""
    try:
        found = rotation.find(path)
        state = checkpoint.load(found)
    except checkpoint.CheckpointError as error:
        raise ConfigError(f"run.from_checkpoint: {error}") from None
    _check_source(state, model, spaces, found)
    owners = _owners(agent)
    source = state["learner"]["loss"]
    wanted = [name for name, part in owners.items() if part in parts]
    missing = [name for name in wanted if name not in source]
    if missing:
        raise ConfigError(f"run.from_checkpoint: {found} lacks {missing[0]}")
    chosen = {name: source[name] for name in wanted}
    agent.loss.load_state_dict(chosen, strict=False)
    stepper = learner.stepper.state_dict()
    if "optimizer" in parts:
        stepper["optimizer"] = state["learner"]["stepper"]["optimizer"]
    if "critic" in parts:
        stepper["target_updater"] = state["learner"]["stepper"]["target_updater"]
    learner.stepper.load_state_dict(stepper)
    log.info(
        "warm start from %s (env step %d): %s; replay and counters start empty",
        found,
        state["steps"]["env_steps"],
        ", ".join(part for part in WARM_START_PARTS if part in parts),
    )
