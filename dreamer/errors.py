"""``ConfigError``: a user's mistake in the configuration, reported in one line (exit 2)."""


class ConfigError(Exception):
    """A user error in the configuration; ``str()`` is one line naming the dotted key."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
