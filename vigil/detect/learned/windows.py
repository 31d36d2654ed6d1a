"""Windows over multivariate series: what every learned detector reads.

``windows`` cuts a strided view of fixed-length windows ending at every row of a series (its earlier history
as the first windows' past); ``WindowSet`` gathers windows of several series, with labels and context per
window, one batch at a time.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from vigil.model import VigilInputError


def windows(values: np.ndarray, length: int, *, history: np.ndarray | None = None) -> np.ndarray:
    """One window of ``length`` rows ending at every row of ``values`` (a strided view, no copy).

    Rows before the first come from ``history`` (the entity's earlier data) and, where that runs out, repeat
    the first available row, so the first windows are defined without inventing a trend.
    """
    if length < 1:
        raise VigilInputError(f"window length must be >= 1, got {length}")
    prefix = history[-(length - 1):] if history is not None and length > 1 else values[:0]
    pad = length - 1 - len(prefix)
    first = prefix[:1] if len(prefix) else values[:1]
    padded = np.concatenate([np.repeat(first, pad, axis=0), prefix, values]).astype(np.float32, copy=False)
    return sliding_window_view(padded, length, axis=0).transpose(0, 2, 1)


class WindowSet:
    """Windows of ``length`` rows ending at chosen rows of several series, gathered one batch at a time.

    Each series is kept as a strided view (``windows``), so a fleet of entities with a day of history per
    window costs no more memory than the series themselves.
    """

    def __init__(self, length: int) -> None:
        self.length = length
        self._views: list[np.ndarray] = []
        self._rows: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._context: list[np.ndarray] = []
        self._offsets = [0]

    def add(self, values: np.ndarray, labels: np.ndarray | None = None, *, history: np.ndarray | None = None,
            context: np.ndarray | None = None, rows: np.ndarray | None = None) -> WindowSet:
        """Windows ending at ``rows`` (default: every row) of ``values``; ``labels`` and ``context`` per row."""
        if self._views and values.shape[1] != self._views[0].shape[2]:
            raise VigilInputError(f"series has {values.shape[1]} metrics, earlier ones {self._views[0].shape[2]}")
        chosen = np.arange(len(values)) if rows is None else np.asarray(rows, dtype=np.int64)
        self._views.append(windows(values, self.length, history=history))
        self._rows.append(chosen)
        lab = np.zeros(len(values), dtype=np.int64) if labels is None else np.asarray(labels, dtype=np.int64)
        self._labels.append(lab[chosen])
        if context is not None:
            self._context.append(np.asarray(context, dtype=np.float32)[chosen])
        self._offsets.append(self._offsets[-1] + len(chosen))
        return self

    @classmethod
    def from_array(cls, X: np.ndarray, labels: np.ndarray | None = None,
                   context: np.ndarray | None = None) -> WindowSet:
        """Wrap ready-made windows (n, length, features)."""
        arr = np.asarray(X, dtype=np.float32)
        ws = cls(arr.shape[1])
        ws._views.append(arr)
        ws._rows.append(np.arange(len(arr)))
        ws._labels.append(np.zeros(len(arr), dtype=np.int64) if labels is None else np.asarray(labels, np.int64))
        if context is not None:
            ws._context.append(np.asarray(context, dtype=np.float32))
        ws._offsets.append(len(arr))
        return ws

    def extended(self, X: np.ndarray, labels: np.ndarray, context: np.ndarray | None = None) -> WindowSet:
        """A new set: these windows, then the ready-made windows ``X`` (n, length, features) with their
        ``labels`` (and ``context`` rows, needed exactly when this set has context)."""
        arr = np.asarray(X, dtype=np.float32)
        if arr.ndim != 3 or arr.shape[1] != self.length or (self._views and arr.shape[2] != self.n_features):
            raise VigilInputError(f"windows of shape {arr.shape} do not extend a set of {self.length}-row windows")
        if (context is None) != (not self._context):
            raise VigilInputError("extended windows need context rows exactly when the set has them")
        out = WindowSet(self.length)
        out._views, out._rows = [*self._views, arr], [*self._rows, np.arange(len(arr))]
        out._labels = [*self._labels, np.asarray(labels, dtype=np.int64)]
        out._context = [*self._context] + ([np.asarray(context, dtype=np.float32)] if context is not None else [])
        out._offsets = [*self._offsets, self._offsets[-1] + len(arr)]
        return out

    def __len__(self) -> int:
        return self._offsets[-1]

    def with_context(self, context: np.ndarray) -> WindowSet:
        """The same windows with ``context`` (one row per window, in order) as their context features."""
        arr = np.asarray(context, dtype=np.float32)
        if len(arr) != len(self):
            raise VigilInputError(f"{len(arr)} context rows for {len(self)} windows")
        out = WindowSet(self.length)
        out._views, out._rows, out._labels, out._offsets = self._views, self._rows, self._labels, self._offsets
        out._context = [arr[self._offsets[k]:self._offsets[k + 1]] for k in range(len(self._views))]
        return out

    @property
    def n_features(self) -> int:
        return int(self._views[0].shape[2])

    @property
    def labels(self) -> np.ndarray:
        return np.concatenate(self._labels) if self._labels else np.zeros(0, dtype=np.int64)

    @property
    def context(self) -> np.ndarray | None:
        return np.concatenate(self._context) if self._context else None

    def take(self, index: np.ndarray, last: int | None = None) -> np.ndarray:
        """The windows at global positions ``index`` (only their ``last`` rows if given), as one array."""
        idx = np.asarray(index, dtype=np.int64)
        rows = self.length if last is None else min(last, self.length)
        part = np.searchsorted(self._offsets, idx, side="right") - 1
        out = np.empty((len(idx), rows, self.n_features), dtype=np.float32)
        for p in np.unique(part):
            mask = part == p
            # Slice the strided view before indexing, so only the rows asked for are copied.
            out[mask] = self._views[p][:, self.length - rows:, :][self._rows[p][idx[mask] - self._offsets[p]]]
        return out

    def last_rows(self, limit: int = 20000, seed: int = 0) -> np.ndarray:
        """The newest row of up to ``limit`` windows (to fit a scaler without touching every window)."""
        n = len(self)
        pick = np.random.default_rng(seed).choice(n, size=min(n, limit), replace=False)
        return self.take(np.sort(pick))[:, -1, :]
