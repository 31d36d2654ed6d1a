"""The one detector interface.

Two faces of the same contract, in the style of scikit-learn / PyOD:

- ``Detector`` scores arrays: hyper-parameters in ``__init__``, ``fit(X, y=None)``, ``score(X)`` (higher is more
  anomalous), ``predict(X)`` (0/1 against ``threshold_``), learned state in attributes ending in ``_``,
  ``get_params`` from scikit-learn's BaseEstimator. Learned models (TCE, LSTM, PCA, ...) implement it.
- ``StreamDetector`` turns what the pipeline sees at one tick (a metric frame and the events since the last
  tick) into ``Anomaly`` records. Rules implement it directly; an array detector joins the pipeline through
  an adapter that keeps its windows.

A new detector is a new class, never a new code path in the pipeline.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

import numpy as np
from sklearn.base import BaseEstimator

from vigil.model import Anomaly, Event, VigilInputError
from vigil.store.metrics import MetricFrame


class Detector(BaseEstimator, ABC):
    """Array detector: ``X`` is (n_samples, n_features) or (n_windows, window, n_features)."""

    name: ClassVar[str] = "detector"

    def fit(self, X: np.ndarray, y: np.ndarray | None = None) -> Self:
        return self

    @abstractmethod
    def score(self, X: np.ndarray) -> np.ndarray:
        """Anomaly score per sample or window; higher means more anomalous."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        threshold = getattr(self, "threshold_", None)
        if threshold is None:
            raise VigilInputError(f"{self.name}: no threshold_ set; fit or calibrate the detector first")
        return (self.score(X) >= threshold).astype(np.int8)


def check_array(X: Any, *, name: str, ndim: Sequence[int] = (2,), n_features: int | None = None) -> np.ndarray:
    """Validate detector input at the edge: shape, dimension count, finiteness."""
    arr = np.asarray(X, dtype=np.float64)
    if arr.ndim not in ndim:
        raise VigilInputError(f"{name}: expected an array with {' or '.join(map(str, ndim))} dimensions, "
                              f"got shape {arr.shape}")
    if n_features is not None and arr.shape[-1] != n_features:
        raise VigilInputError(f"{name}: expected {n_features} features (as at fit time), got {arr.shape[-1]}")
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).sum())
        raise VigilInputError(f"{name}: input holds {bad} NaN or infinite values; impute gaps first "
                              "(see docs/detection.md)")
    return arr


@runtime_checkable
class StreamDetector(Protocol):
    """What the pipeline calls once per tick."""

    name: str

    def detect(self, frames: Sequence[MetricFrame], events: Sequence[Event]) -> list[Anomaly]:
        """Anomalies seen in this tick's frames (one per metric family) and the events since the last tick."""
        ...
