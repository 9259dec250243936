"""What one stored transition holds: the entries an update reads (``replay_keys``), each a
``Field``; a one-hot action is stored as one index per head (uint8 up to 256 choices)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict
from torch.nn import functional

ENV_INDEX = "env_index"
ACTION = "action"


def replay_keys(obs_names: list[str]) -> list:
    """The entries one DreamerV3 update reads; nothing else is stored. No latent: the
    world model starts every window from zeros (``ZeroStartRollout``)."""
    return [
        ACTION,
        "is_init",
        *[("next", name) for name in obs_names],
        ("next", "reward"),
        ("next", "done"),
        ("next", "terminated"),
    ]


def action_heads(spaces) -> tuple[int, ...]:
    """The one-hot heads of a discrete action layout (one for a flat one), else ()."""
    if not spaces.discrete:
        return ()
    return tuple(head.size for head in spaces.action_heads) or (spaces.action_dim,)


def row_bytes(spaces) -> int:
    """About the bytes one stored transition takes (images uint8, vectors float32,
    actions as indices or float32, is_init, reward, done, terminated)."""
    obs = sum(key.size * (1 if key.kind == "image" else 4) for key in spaces.obs)
    heads = action_heads(spaces)
    action = len(heads) * index_dtype(heads).itemsize if heads else spaces.action_dim * 4
    return obs + action + 1 + 4 + 1 + 1


def index_dtype(heads: tuple[int, ...]) -> torch.dtype:
    largest = max(heads)
    return torch.uint8 if largest <= 256 else torch.int16 if largest <= 32768 else torch.int32


def random_batch(spaces, batch: int, length: int, seed: int = 0) -> TensorDict:
    """A [batch, length] sample of random data in the layout ``SequenceReplay.sample``
    gives for ``spaces`` (keys, dtypes, shapes): for timing an update before any data
    exists, and for learners whose envs cannot run here. ~5% of steps end an episode."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, length)
    nxt = {}
    for key in spaces.obs:
        if key.kind == "image":
            nxt[key.name] = torch.randint(0, 256, (*shape, *key.shape), generator=g).byte()
        else:
            nxt[key.name] = torch.randn(*shape, *key.shape, generator=g)
    if heads := action_heads(spaces):
        parts = [torch.randint(0, n, shape, generator=g) for n in heads]
        action = torch.cat([functional.one_hot(p, n) for p, n in zip(parts, heads)], -1)
    else:
        action = torch.rand(*shape, spaces.action_dim, generator=g) * 2 - 1
    done = torch.rand(*shape, 1, generator=g) < 0.05
    nxt.update(
        reward=torch.randn(*shape, 1, generator=g),
        done=done,
        terminated=done & (torch.rand(*shape, 1, generator=g) < 0.5),
    )
    is_init = torch.zeros(*shape, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[:, 1:] = done[:, :-1]
    return TensorDict({ACTION: action, "is_init": is_init, "next": TensorDict(nxt, shape)}, shape)


@dataclass(frozen=True)
class Field:
    """One stored entry: its key, and a row's dtype and shape as collected (and as
    sampled). ``heads``: a one-hot action stored as one index per head."""

    key: str | tuple[str, ...]
    dtype: torch.dtype
    shape: tuple[int, ...]
    heads: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return "/".join(self.key) if isinstance(self.key, tuple) else self.key

    @property
    def stored_dtype(self) -> torch.dtype:
        return index_dtype(self.heads) if self.heads else self.dtype

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return (len(self.heads),) if self.heads else self.shape

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.stored_shape, dtype=np.int64)) * self.stored_dtype.itemsize

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        if not self.heads:
            return values
        parts = values.split(self.heads, -1)
        stored = torch.stack([part.argmax(-1) for part in parts], -1).to(self.stored_dtype)
        if not torch.equal(self.decode(stored), values.to(self.dtype)):
            raise ValueError(
                f"replay: {self.name} is not one-hot in each of its heads {list(self.heads)}"
            )
        return stored

    def decode(self, stored: torch.Tensor) -> torch.Tensor:
        if not self.heads:
            return stored
        hot = [functional.one_hot(stored[..., i].long(), n) for i, n in enumerate(self.heads)]
        return torch.cat(hot, -1).to(self.dtype)

    def to_state(self) -> dict:
        key = list(self.key) if isinstance(self.key, tuple) else [self.key]
        dtype = str(self.dtype).removeprefix("torch.")
        return {"key": key, "dtype": dtype, "shape": list(self.shape), "heads": list(self.heads)}

    @classmethod
    def from_state(cls, state: dict) -> Field:
        key = tuple(state["key"]) if len(state["key"]) > 1 else state["key"][0]
        dtype = getattr(torch, state["dtype"])
        return cls(key, dtype, tuple(state["shape"]), tuple(state["heads"]))
