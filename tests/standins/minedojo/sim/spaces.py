"""Stand-in for ``minedojo.sim.spaces`` on top of gymnasium.

Only what the ARNN-wrapped env exposes: ``Text`` (an array of strings, e.g. inventory names)
and ``MultiDiscrete`` with MineDojo's ``no_op()``.  Box/Dict/Discrete are gymnasium's own.
"""

from __future__ import annotations

import string

import gymnasium
import numpy as np
from gymnasium.spaces import Box, Dict, Discrete

__all__ = ["Box", "Dict", "Discrete", "MultiDiscrete", "Text"]


class Text(gymnasium.Space):
    """A fixed-shape numpy array of unicode strings (MineDojo's ``spaces.Text``)."""

    def __init__(self, shape, seed=None):
        super().__init__(
            shape=tuple(int(s) for s in np.atleast_1d(shape)), dtype=np.str_, seed=seed
        )

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def contains(self, x) -> bool:
        return isinstance(x, np.ndarray) and x.shape == self.shape and x.dtype.kind in ("U", "S")

    def sample(self, mask=None, probability=None):
        letters = np.array(list(string.ascii_lowercase))
        n = int(np.prod(self.shape))
        lengths = self.np_random.integers(0, 12, size=n)
        words = ["".join(self.np_random.choice(letters, size=k)) for k in lengths]
        return np.array(words, dtype=np.str_).reshape(self.shape)

    def no_op(self, batch_shape=()):
        return ""

    def __repr__(self) -> str:
        return f"Text{self.shape}"

    def __eq__(self, other) -> bool:
        return isinstance(other, Text) and other.shape == self.shape


class MultiDiscrete(gymnasium.spaces.MultiDiscrete):
    """gymnasium MultiDiscrete plus MineDojo's ``no_op()`` (camera bins centred)."""

    def __init__(self, nvec, noop_vec=None, seed=None):
        super().__init__(nvec, dtype=np.int64, seed=seed)
        if noop_vec is not None:
            noop_vec = np.asarray(noop_vec, dtype=self.dtype)
            assert noop_vec.shape == self.nvec.shape and self.contains(noop_vec)
        self._noop_vec = noop_vec

    def no_op(self, batch_shape=()):
        base = (
            np.zeros(self.nvec.shape, dtype=self.dtype)
            if self._noop_vec is None
            else self._noop_vec
        )
        return np.broadcast_to(base, tuple(batch_shape) + base.shape).copy()
