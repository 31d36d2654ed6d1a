"""Baseline detectors behind the same interface as TCE, so every comparison is like for like.

- ``LSTMDetector``: the learned baseline of the mission (an LSTM over windows of 30 samples taken every 5,
  alarm above 0.85): it forecasts the newest sample from the 29 before it; the score is the forecast error's
  position in the training errors' distribution (0.85 = worse than 85 % of training windows), growing
  logarithmically past the largest training error so scores above it still rank.
- ``PCADetector`` and ``IForestDetector``: PyOD's PCA (reconstruction from the top components) and
  Isolation Forest.
- ``KMeansDetector``: distance of a window to its nearest k-means centroid (TSB-AD's KMeansAD idea), with
  scikit-learn's MiniBatchKMeans.
- ``RandomDetector``: uniform random scores, the floor every honest table needs.

Unsupervised baselines are fitted on normal data: when labels are given, anomalous windows are left out.
Inputs are (n, features) rows, (n, window, features) windows or a ``WindowSet``; each detector reads only the
newest ``window`` rows of a window, flattened.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import numpy as np
import torch
from sklearn.cluster import MiniBatchKMeans
from torch import nn

from vigil.detect.base import Detector
from vigil.model import VigilInputError
from vigil_eval.datasets import WindowSet

MAX_FIT_SAMPLES = 20000


def newest_rows(X: Any, window: int, *, name: str) -> np.ndarray:
    """(n, window, features) from rows, windows or a WindowSet; refuses NaN and too-short windows."""
    if isinstance(X, WindowSet):
        arr = X.take(np.arange(len(X)), last=window)
    else:
        arr = np.asarray(X, dtype=np.float32)
        if arr.ndim == 2:
            arr = arr[:, None, :]
        if arr.ndim != 3:
            raise VigilInputError(f"{name}: expected (n, features) or (n, window, features), got shape {arr.shape}")
        arr = arr[:, -window:, :]
    if arr.shape[1] < window:
        raise VigilInputError(f"{name}: needs windows of {window} rows, got {arr.shape[1]}")
    if not np.isfinite(arr).all():
        raise VigilInputError(f"{name}: input holds NaN or infinite values; impute gaps first (docs/detection.md)")
    return arr


def _normal_sample(X: Any, y: np.ndarray | None, window: int, seed: int, *, name: str) -> np.ndarray:
    """Normal training windows, at most MAX_FIT_SAMPLES of them."""
    labels = X.labels if isinstance(X, WindowSet) and y is None else y
    if isinstance(X, WindowSet):
        keep = np.arange(len(X)) if labels is None else np.flatnonzero(np.asarray(labels) == 0)
        if len(keep) > MAX_FIT_SAMPLES:
            keep = np.sort(np.random.default_rng(seed).choice(keep, MAX_FIT_SAMPLES, replace=False))
        return X.take(keep, last=window)
    arr = newest_rows(X, window, name=name)
    if labels is not None:
        arr = arr[np.asarray(labels) == 0]
    if len(arr) > MAX_FIT_SAMPLES:
        arr = arr[np.sort(np.random.default_rng(seed).choice(len(arr), MAX_FIT_SAMPLES, replace=False))]
    return arr


class _FlatWindowDetector(Detector):
    window: int
    seed: int

    def _check_features(self, arr: np.ndarray) -> None:
        expected = getattr(self, "n_features_", None)
        if expected is not None and arr.shape[2] != expected:
            raise VigilInputError(f"{self.name}: expected {expected} features (as at fit time), got {arr.shape[2]}")

    def fit(self, X: Any, y: np.ndarray | None = None) -> Self:
        arr = _normal_sample(X, y, self.window, self.seed, name=self.name)
        if not len(arr):
            raise VigilInputError(f"{self.name}: no normal windows to fit on")
        self.n_features_ = arr.shape[2]
        self._fit_flat(arr.reshape(len(arr), -1))
        return self

    def score(self, X: Any) -> np.ndarray:
        if getattr(self, "n_features_", None) is None:
            raise VigilInputError(f"{self.name}: fit the detector first")
        arr = newest_rows(X, self.window, name=self.name)
        self._check_features(arr)
        return self._score_flat(arr.reshape(len(arr), -1))

    def _fit_flat(self, flat: np.ndarray) -> None:
        raise NotImplementedError

    def _score_flat(self, flat: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class PCADetector(_FlatWindowDetector):
    name: ClassVar[str] = "pca"

    def __init__(self, window: int = 1, n_components: float = 0.95, seed: int = 0) -> None:
        self.window = window
        self.n_components = n_components
        self.seed = seed

    def _fit_flat(self, flat: np.ndarray) -> None:
        from pyod.models.pca import PCA

        self.model_ = PCA(n_components=self.n_components, random_state=self.seed).fit(flat)

    def _score_flat(self, flat: np.ndarray) -> np.ndarray:
        return np.asarray(self.model_.decision_function(flat), dtype=np.float64)


class IForestDetector(_FlatWindowDetector):
    name: ClassVar[str] = "iforest"

    def __init__(self, window: int = 1, n_estimators: int = 100, seed: int = 0) -> None:
        self.window = window
        self.n_estimators = n_estimators
        self.seed = seed

    def _fit_flat(self, flat: np.ndarray) -> None:
        from pyod.models.iforest import IForest

        self.model_ = IForest(n_estimators=self.n_estimators, random_state=self.seed, n_jobs=1).fit(flat)

    def _score_flat(self, flat: np.ndarray) -> np.ndarray:
        return np.asarray(self.model_.decision_function(flat), dtype=np.float64)


class KMeansDetector(_FlatWindowDetector):
    name: ClassVar[str] = "kmeans"

    def __init__(self, window: int = 10, n_clusters: int = 20, seed: int = 0) -> None:
        self.window = window
        self.n_clusters = n_clusters
        self.seed = seed

    def _fit_flat(self, flat: np.ndarray) -> None:
        k = min(self.n_clusters, len(flat))
        self.model_ = MiniBatchKMeans(n_clusters=k, random_state=self.seed, n_init=3).fit(flat)

    def _score_flat(self, flat: np.ndarray) -> np.ndarray:
        return np.asarray(self.model_.transform(flat).min(axis=1), dtype=np.float64)


class RandomDetector(_FlatWindowDetector):
    name: ClassVar[str] = "random"

    def __init__(self, seed: int = 0) -> None:
        self.window = 1
        self.seed = seed

    def _fit_flat(self, flat: np.ndarray) -> None:
        self.threshold_ = 0.5

    def _score_flat(self, flat: np.ndarray) -> np.ndarray:
        return np.random.default_rng(self.seed).random(len(flat))


class _Forecaster(nn.Module):
    def __init__(self, n_features: int, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, batch_first=True)
        self.out = nn.Linear(hidden, n_features)

    def forward(self, past: torch.Tensor) -> torch.Tensor:
        states, _ = self.lstm(past)
        return self.out(states[:, -1, :])


class LSTMDetector(_FlatWindowDetector):
    """The mission's LSTM baseline: window 30, stride 5, threshold 0.85 (see module docstring)."""

    name: ClassVar[str] = "lstm"

    def __init__(self, window: int = 30, stride: int = 5, threshold: float = 0.85, hidden: int = 32,
                 epochs: int = 5, batch_size: int = 128, lr: float = 3e-3, seed: int = 0) -> None:
        self.window = window
        self.stride = stride
        self.threshold = threshold
        self.hidden = hidden
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.seed = seed

    def fit(self, X: Any, y: np.ndarray | None = None) -> Self:
        arr = _normal_sample(X, y, self.window, self.seed, name=self.name)
        if len(arr) < 2:
            raise VigilInputError(f"{self.name}: too few normal windows to fit on")
        arr = arr[:: self.stride]
        self.n_features_ = arr.shape[2]
        self.mean_ = arr[:, -1, :].mean(axis=0)
        std = arr[:, -1, :].std(axis=0)
        self.std_ = np.where(std < 1e-6, 1.0, std)
        torch.manual_seed(self.seed)
        self.model_ = _Forecaster(self.n_features_, self.hidden)
        optimiser = torch.optim.Adam(self.model_.parameters(), lr=self.lr)
        data = torch.from_numpy(((arr - self.mean_) / self.std_).astype(np.float32))
        rng = np.random.default_rng(self.seed)
        self.model_.train()
        for _ in range(self.epochs):
            order = rng.permutation(len(data))
            for start in range(0, len(data), self.batch_size):
                batch = data[order[start:start + self.batch_size]]
                loss = ((self.model_(batch[:, :-1]) - batch[:, -1]) ** 2).mean()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        self.train_errors_ = np.sort(self._errors(arr))
        self.threshold_ = self.threshold
        return self

    def _errors(self, arr: np.ndarray) -> np.ndarray:
        self.model_.eval()
        out = []
        with torch.no_grad():
            for start in range(0, len(arr), 4096):
                batch = torch.from_numpy(((arr[start:start + 4096] - self.mean_) / self.std_).astype(np.float32))
                out.append(((self.model_(batch[:, :-1]) - batch[:, -1]) ** 2).mean(dim=1).numpy())
        return np.concatenate(out).astype(np.float64)

    def score(self, X: Any) -> np.ndarray:
        if getattr(self, "model_", None) is None:
            raise VigilInputError(f"{self.name}: fit the detector first")
        arr = newest_rows(X, self.window, name=self.name)
        self._check_features(arr)
        errors = self._errors(arr)
        ref = self.train_errors_
        quantile = np.searchsorted(ref, errors, side="right") / len(ref)
        beyond = np.log1p(np.maximum(errors - ref[-1], 0.0) / max(ref[-1], 1e-12))
        return quantile + beyond


BASELINES: dict[str, type[Detector]] = {
    cls.name: cls for cls in (LSTMDetector, PCADetector, IForestDetector, KMeansDetector, RandomDetector)
}
