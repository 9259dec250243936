"""DreamerV3 on torchrl. ``from dreamer import Policy`` acts with a trained run.

Importing ``dreamer`` stays cheap and side-effect free: ``Policy`` (torch, torchrl)
is imported on first use."""


def __getattr__(name: str):
    if name == "Policy":
        from dreamer.serving.policy import Policy

        return Policy
    raise AttributeError(f"module 'dreamer' has no attribute {name!r}")


__all__ = ["Policy"]
