"""``ConfigError``: a user's mistake in the configuration, reported in one line (exit 2);
``did_you_mean``: the closest of what was allowed, for a typo; ``first_line``: what an
exception says, for such a line."""

import difflib
from collections.abc import Iterable


class ConfigError(Exception):
    """A user error in the configuration; ``str()`` is one line naming the dotted key."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def did_you_mean(word: str, allowed: Iterable[str], shown: str = "{}") -> str:
    """``" (did you mean X?)"`` for the allowed name closest to a typo of it (as ``shown``
    formats it, e.g. ``"env={}"``), else ``""``."""
    found = difflib.get_close_matches(word, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {shown.format(found[0])}?)" if found else ""


def first_line(error: BaseException, skip: tuple[str, ...] = ()) -> str:
    """The first line of ``error``'s message that does not start with one of ``skip`` (a
    library's advice around it), at most 120 characters; its type's name where it says
    nothing else."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(skip)] if skip else lines
    return lines[0][:120] if lines else type(error).__name__
