"""A dead child process of a run, replaced: one way for every kind to count it and say
so. Env workers count as ``env/restarts`` (``EpisodeStats``); the rest here, as
``restarts/<kind>`` in every metrics row and in the checkpoint (over resumes)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

KINDS = ("inference", "eval", "render")
ATTEMPTS = 2  # the work a dead process was doing runs once more on its replacement


class Relaunches:
    def __init__(self):
        self.counts = dict.fromkeys(KINDS, 0)

    def replacing(self, kind: str | None, what: str, replacement: str) -> None:
        """``what`` died (``kind``: counted here; None: an env worker, counted as an
        episode stat), and ``replacement`` is started: one ERROR line of one form."""
        if kind is not None:
            self.counts[kind] += 1
        log.error("%s; replacing %s", what, replacement)

    @staticmethod
    def again(attempt: int) -> bool:
        """Whether work whose process died at its ``attempt``-th try is tried again."""
        return attempt < ATTEMPTS

    def metrics(self) -> dict[str, int]:
        return {f"restarts/{kind}": count for kind, count in self.counts.items()}

    def state_dict(self) -> dict:
        return dict(self.counts)

    def load_state_dict(self, state: dict) -> None:
        self.counts.update(state)
