"""Every key a run writes to ``metrics.jsonl`` (and sends its trackers), with what it
holds: the one source of docs/outputs.md's metrics table (tests/test_docs.py holds them
equal; the runs' tests hold every key they write to it).

Names: ``loss_*`` are the weighted terms the update minimises (their sum; torchrl's
names); the update's other scalars, under torchrl's names inside the loss, are logged
under ``update/``; counts since the run began say so (``episode/total``)."""

from __future__ import annotations

import re

LOGGED_AS = {  # the loss's diagnostics (torchrl's names) -> the key a run logs
    "actor_entropy": "update/actor_entropy",
    "return_low": "update/return_low",
    "return_high": "update/return_high",
    "return_scale": "update/return_scale",
    "continuation_mean": "update/continuation_mean",
    "value_slow_loss": "update/slow_value_term",
    "replay_value": "update/replay_value_term",
}

TRAINING = {
    "timestamp": "Unix seconds when the row's interval ended",
    "env_steps": "env steps collected so far (the unit of `run.steps`)",
    "updates": "learner updates so far",
    "env_steps_per_s": "env steps per wall second over the row's interval",
    "updates_per_s": "updates per wall second over the row's interval",
    "replay/size": "transitions held in the replay",
    "policy_version": "weights pushed to the acting policy so far",
    "learner/skipped": "updates skipped for NaN/Inf gradients so far",
    "loss_model_reco": "the world model's observation reconstruction (weighted; "
    "every `loss_*` is a mean over the row's updates)",
    "loss_model_reward": "its reward prediction",
    "loss_model_continue": "its continuation prediction",
    "loss_model_dynamic": "the KL pulling the prior to the posterior (dyn, clipped at "
    "`learner.free_nats`)",
    "loss_model_representation": "the KL keeping the posterior predictable (rep)",
    "loss_actor": "the actor on imagined returns (REINFORCE with an entropy bonus)",
    "loss_value": "the critic on imagined returns, with its pull to the slow critic",
    "loss_replay_value": "the critic on replayed states",
    "update/actor_entropy": "the actor's entropy on imagined states",
    "update/return_low": "the moving 5th percentile of imagined returns (return normalisation)",
    "update/return_high": "the moving 95th percentile",
    "update/return_scale": "max(1, high - low): what the actor's advantages are divided by",
    "update/continuation_mean": "the mean predicted continuation of imagined states",
    "update/slow_value_term": "the critic's pull to the slow critic before its weight "
    "`learner.slowreg`",
    "update/replay_value_term": "`loss_replay_value` before its scale",
    "episode/total": "training episodes finished since the run began",
    "episode/count": "training episodes finished in the row's interval (rows with none "
    "leave out the `episode/` means and `achievements/`)",
    "episode/return": "their mean return",
    "episode/length": "their mean length in env steps",
    "achievements/<name>": "Crafter: how many of them unlocked the achievement",
    "env/restarts": "training envs recreated after a failed step, since the run began",
    "restarts/<eval|inference|render>": "the evaluation process, the inference server "
    "or the render pool replaced after it died, since the run began",
    "gc/seconds": "seconds in Python's garbage collector since the loop began",
    "gc/gen<0|1|2>_seconds": "of them, in collections of that generation",
    "gc/gen<0|1|2>_collections": "collections of that generation since the loop began",
    "gc/frozen_objects": "objects `gc.freeze()` moved out of the collector's reach",
    "gc/full_collection_s": "the pause of a full collection as the loop began (frozen or not)",
    "gc/gen2_longest_s": "the longest pause of a generation-2 collection since the loop began",
    "time/collect_wait_s": "wall seconds of the interval waiting for collected data",
    "time/sample_s": "sampling replay batches",
    "time/update_s": "in learner updates",
    "time/sync_s": "pushing weights to the acting policy",
    "time/log_s": "writing rows and checkpoints",
    "time/eval_s": "handing out and collecting evaluations",
    "time/wall_s": "the interval's wall seconds",
    "time/s_per_update": "wall seconds per update in the loop (rows with updates)",
    "time/update_s_per_update": "the update's own seconds per update: its ratio to "
    "`time/s_per_update` is what the loop costs the update",
}

EVALUATION = {
    "eval/return": "mean return of the evaluation's episodes",
    "eval/return_std": "their standard deviation",
    "eval/length": "their mean length in env steps",
    "eval/episodes": "how many episodes (`eval.episodes`)",
    "eval/achievements/<name>": "Crafter: the % of them that unlocked the achievement",
    "eval/crafter_score": "Crafter's score: the geometric mean of (1 + rate) minus 1",
}

METRICS = {**TRAINING, **EVALUATION}


def _pattern(key: str) -> re.Pattern:
    """``<name>`` matches a name, ``<a|b>`` one of the choices."""
    parts = re.split(r"<([^>]*)>", key)
    regex = ""
    for index, part in enumerate(parts):
        if index % 2 == 0:
            regex += re.escape(part)
        else:
            regex += "[A-Za-z0-9_]+" if part == "name" else f"(?:{part})"
    return re.compile(regex + r"\Z")


PATTERNS = [_pattern(key) for key in METRICS]


def documented(key: str) -> bool:
    return any(pattern.match(key) for pattern in PATTERNS)


def logged(metrics: dict) -> dict:
    """The update's scalars under the keys a run logs."""
    return {LOGGED_AS.get(key, key): value for key, value in metrics.items()}


def table() -> str:
    """docs/outputs.md's metrics table (its rows, in this order)."""
    rows = ["| key | holds |", "|---|---|"]
    rows += [f"| `{key}` | {meaning} |" for key, meaning in METRICS.items()]
    return "\n".join(rows)
