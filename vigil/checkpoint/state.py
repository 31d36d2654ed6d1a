"""What a lossless restart needs besides weights: RNG streams and the data position.

Model and optimizer state go through torch.distributed.checkpoint's state-dict helpers; this module
adds the per-rank parts. They are stored under a per-rank key, because DCP de-duplicates entries that
share a key across ranks and would otherwise keep only rank 0's RNG stream.
"""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import torch

from vigil.store.safe_pickle import load_data, load_data_with_arrays


def capture_rng() -> dict[str, Any]:
    """Every RNG stream a training step may draw from (python, numpy, torch CPU, and CUDA when present)."""
    state: dict[str, Any] = {
        "python": pickle.dumps(random.getstate()),
        "numpy": pickle.dumps(np.random.get_state()),
        "torch": torch.get_rng_state().clone(),
    }
    if torch.cuda.is_available():
        # Raw bytes, not pickled tensors: restoring reads them as data only.
        state["cuda"] = pickle.dumps([s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()])
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set every stream back; the pickled parts are read as plain data (a checkpoint never runs code)."""
    random.setstate(load_data(bytes(state["python"]), "checkpoint python RNG state"))
    np.random.set_state(load_data_with_arrays(bytes(state["numpy"]), "checkpoint numpy RNG state"))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        raw = load_data(bytes(state["cuda"]), "checkpoint CUDA RNG state")
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in raw])


def rank_key(rank: int) -> str:
    return f"rank{rank}"


class ShardedSampler:
    """Deterministic, resumable sampler: a fresh permutation per epoch, each rank takes its stride.

    Its position (epoch, offset) is part of the checkpoint, so a resumed job sees exactly the batches
    the lost run would have seen next.
    """

    def __init__(self, dataset_size: int, batch_size: int, rank: int, world_size: int, seed: int = 0):
        if dataset_size < batch_size * world_size:
            raise ValueError("dataset smaller than one global batch")
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.dataset_size, generator=generator)

    def next_batch(self) -> torch.Tensor:
        """Indices of this rank's next batch; wraps to a new epoch when the global batch does not fit."""
        global_batch = self.batch_size * self.world_size
        if self.offset + global_batch > self.dataset_size:
            self.epoch += 1
            self.offset = 0
            self._order = self._permutation(self.epoch)
        start = self.offset + self.rank * self.batch_size
        self.offset += global_batch
        return self._order[start : start + self.batch_size]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self._order = self._permutation(self.epoch)
