"""How often each kind of child process of a run died and was started again.

Env workers are counted by ``EpisodeStats`` as ``env/restarts`` (a replaced collector);
the rest here, written to every metrics row as ``restarts/<kind>`` and kept in the
checkpoint, so the counts run over resumes."""

from __future__ import annotations

KINDS = ("inference", "eval", "render")


class Relaunches:
    def __init__(self):
        self.counts = dict.fromkeys(KINDS, 0)

    def add(self, kind: str) -> None:
        self.counts[kind] += 1

    def metrics(self) -> dict[str, int]:
        return {f"restarts/{kind}": count for kind, count in self.counts.items()}

    def state_dict(self) -> dict:
        return dict(self.counts)

    def load_state_dict(self, state: dict) -> None:
        self.counts.update(state)
