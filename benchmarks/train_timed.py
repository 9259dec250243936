"""``python -m dreamer.train`` with the start and end (Unix seconds) of each learner
update appended to a file, one ``start end`` line per update: the timeline
``benchmarks/threads.py`` sets beside its probe of the cores' placement.

    python benchmarks/train_timed.py UPDATES_FILE [override ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# first: dreamer.train sets libgomp's spin before torch loads, as in a user's run
from dreamer import train  # noqa: E402, I001

import functools  # noqa: E402
import time  # noqa: E402

from dreamer.learning.learner import Learner  # noqa: E402


def main() -> int:
    timeline = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115  (open for the run)
    original = Learner.update

    @functools.wraps(original)
    def update(learner, batch):
        started = time.time()
        try:
            return original(learner, batch)
        finally:
            timeline.write(f"{started} {time.time()}\n")

    Learner.update = update
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    return train.cli()


if __name__ == "__main__":
    sys.exit(main())
