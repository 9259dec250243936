"""Replay: one circular stream per env worker, sampled as windows of consecutive steps.

Storage is torchrl's (``LazyTensorStorage``). The sampling is ours: the collector
delivers interleaved chunks from many workers, and a DreamerV3 sequence must be
``length`` consecutive steps of ONE worker's stream (episode starts inside it are
marked by ``is_init``, where the RSSM resets). torchrl's ``SliceSampler`` cuts
trajectories by contiguous storage, which chunk interleaving breaks, and it cannot
exclude windows that straddle a stream's write cursor.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage

ENV_INDEX = "env_index"


def replay_keys(obs_names: list[str]) -> list:
    """The entries one DreamerV3 update reads; nothing else is stored."""
    return [
        "action",
        "is_init",
        "state",
        "belief",
        *[("next", name) for name in obs_names],
        ("next", "reward"),
        ("next", "done"),
        ("next", "terminated"),
    ]


class SequenceReplay:
    def __init__(
        self,
        capacity: int,
        streams: int,
        batch: int,
        length: int,
        keys: list,
        seed: int = 0,
    ):
        self.per_stream = max(capacity // streams, length)
        self.streams = streams
        self.batch = batch
        self.length = length
        self.keys = keys
        self.storages = [LazyTensorStorage(self.per_stream) for _ in range(streams)]
        # written[i]: transitions ever written to stream i (its write cursor in time)
        self.written = torch.zeros(streams, dtype=torch.long)
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return int(self.written.clamp(max=self.per_stream).sum())

    def extend(self, data: TensorDictBase) -> None:
        """Append a batch of transitions routed by their ``env_index`` entry."""
        data = data.reshape(-1)
        env_index = data.get(ENV_INDEX).reshape(-1)
        data = data.select(*self.keys)
        for stream in env_index.unique().tolist():
            rows = data[env_index == stream]
            count = rows.shape[0]
            start = int(self.written[stream])
            positions = torch.arange(start, start + count) % self.per_stream
            if count > self.per_stream:  # keep only what fits
                rows, positions = rows[-self.per_stream :], positions[-self.per_stream :]
            self.storages[stream].set(positions, rows)
            self.written[stream] += count

    def _window_counts(self) -> torch.Tensor:
        stored = self.written.clamp(max=self.per_stream)
        return (stored - self.length + 1).clamp(min=0)

    def can_sample(self) -> bool:
        return bool(self._window_counts().sum() > 0)

    def sample(self) -> TensorDict:
        """``batch`` windows of ``length`` steps, shape [batch, length]."""
        counts = self._window_counts()
        if counts.sum() == 0:
            raise RuntimeError(f"no stream holds {self.length} consecutive steps yet")
        streams = torch.multinomial(
            counts.float(), self.batch, replacement=True, generator=self.generator
        )
        offsets = (torch.rand(self.batch, generator=self.generator) * counts[streams]).long()
        oldest = self.written[streams] - self.written[streams].clamp(max=self.per_stream)
        positions = (oldest + offsets).unsqueeze(1) + torch.arange(self.length)
        positions = positions % self.per_stream
        # one storage read per stream, then back into the sampled order
        rows, parts = [], []
        for stream in streams.unique().tolist():
            chosen = (streams == stream).nonzero().squeeze(1)
            rows.append(chosen)
            parts.append(self.storages[stream].get(positions[chosen].reshape(-1)))
        windows = torch.cat(parts, 0).reshape(self.batch, self.length)
        return windows[torch.cat(rows).argsort()]

    def state_dict(self) -> dict:
        return {
            "written": self.written.clone(),
            "generator": self.generator.get_state(),
            "streams": [
                storage.state_dict() if len(storage) else None for storage in self.storages
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        self.written = state["written"].clone()
        self.generator.set_state(state["generator"])
        for storage, saved in zip(self.storages, state["streams"], strict=True):
            if saved is not None:
                storage.load_state_dict(saved)
