"""Baseline detectors behind the same interface as TCE, so every comparison is like for like.

- ``LSTMDetector``: the learned baseline of the mission (an LSTM over windows of 30 samples taken every 5,
  alarm above 0.85): it forecasts the newest sample from the 29 before it; the score is the forecast error's
  position in the training errors' distribution (0.85 = worse than 85 % of training windows), growing
  logarithmically past the largest training error so scores above it still rank.
- ``PCADetector`` and ``IForestDetector``: PyOD's PCA (reconstruction from the top components) and
  Isolation Forest.
- ``KMeansDetector``: distance of a window to its nearest k-means centroid (TSB-AD's KMeansAD idea), with
  scikit-learn's MiniBatchKMeans.
- ``OwnHistoryKMeansDetector``: the same KMeansAD fitted per machine, on the older half of the scored machine's
  own unlabelled history and read against the newer half (``score_own_history``), never on the fleet: the
  per-machine baseline of TCE's own-history part, at its settings.
- ``KNNDetector``: distance of a sample to its ``k``-th nearest normal training sample (TAB's KNN).
- ``RandomDetector``: uniform random scores, the floor every honest table needs.

Supervised baselines, fed the same labels as TCE:

- ``GradientBoostingDetector``: scikit-learn's HistGradientBoostingClassifier on the window features of
  ``features.py`` (the same features TCE reads as its context); score = ``1 - p(normal)``. Above
  ``max_samples`` training windows, normal ones are thinned at random (every anomalous window kept) and the
  normal class is re-weighted by the thinning factor, so fitting on a large fleet costs no more than on a
  small one and the class prior is unchanged.
- ``LSTMClassifierDetector``: an LSTM over the newest 30 rows with a linear head over the classes, trained
  with class-balanced cross-entropy; score = ``1 - p(normal)``.

Unsupervised baselines are fitted on normal data: when labels are given, anomalous windows are left out.
Inputs are (n, features) rows, (n, window, features) windows or a ``WindowSet``; each detector reads only the
newest ``window`` rows of a window, flattened.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import numpy as np
import torch
from sklearn.base import clone
from sklearn.cluster import MiniBatchKMeans
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.neighbors import NearestNeighbors
from torch import nn

from vigil.detect.base import BaseDetector
from vigil.detect.learned.features import window_features
from vigil.detect.learned.tce import OWN_FIT_SHARE
from vigil.detect.learned.windows import WindowSet
from vigil.model import VigilInputError

MAX_FIT_SAMPLES = 20000
BATCH = 4096


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


class _FlatWindowDetector(BaseDetector):
    window: int
    seed: int
    supervised: ClassVar[bool] = False

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

    def decision_function(self, X: Any) -> np.ndarray:
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
        # Only the centroids are kept: arrays, so the detector saves and loads as data (BaseDetector.save).
        self.centroids_ = MiniBatchKMeans(n_clusters=k, random_state=self.seed, n_init=3).fit(flat).cluster_centers_

    def _score_flat(self, flat: np.ndarray) -> np.ndarray:
        # |a - c|^2 = |a|^2 - 2 a.c + |c|^2: no (samples x centroids x features) intermediate.
        centroids = np.asarray(self.centroids_, dtype=np.float64)
        rows = np.asarray(flat, dtype=np.float64)
        squared = (rows ** 2).sum(axis=1)[:, None] - 2 * rows @ centroids.T + (centroids ** 2).sum(axis=1)[None, :]
        return np.sqrt(np.maximum(squared.min(axis=1), 0.0))


class OwnHistoryKMeansDetector(KMeansDetector):
    """KMeansAD fitted on one machine's own unlabelled history when that machine is scored
    (``score_own_history``), as TCE's own-history part is (``TCEDetector.own_memory_distance``, same centroids,
    rows and split); ``per_machine``: the evaluation never fits it on other machines."""

    name: ClassVar[str] = "kmeans-own"
    per_machine: ClassVar[bool] = True

    def __init__(self, window: int = 10, n_clusters: int = 20, fit_share: float = OWN_FIT_SHARE,
                 seed: int = 0) -> None:
        super().__init__(window=window, n_clusters=n_clusters, seed=seed)
        self.fit_share = fit_share

    def score_own_history(self, X: Any, history: Any) -> tuple[np.ndarray, np.ndarray]:
        """A fresh copy fitted on the older ``fit_share`` of ``history`` (windows of the scored machine's
        unlabelled history, oldest first); returns its scores of ``X`` and of the newer rest of ``history``
        (out of sample: the reference the scores are read against)."""
        rows = newest_rows(history, self.window, name=self.name)
        cut = int(round(len(rows) * self.fit_share))
        if cut < 2 or len(rows) - cut < 2:
            raise VigilInputError(f"{self.name}: needs at least 4 history windows of the machine, got {len(rows)}")
        own = clone(self).fit(rows[:cut])
        return own.decision_function(X), own.decision_function(rows[cut:])


class KNNDetector(_FlatWindowDetector):
    name: ClassVar[str] = "knn"

    def __init__(self, window: int = 1, n_neighbors: int = 5, max_samples: int = 10000, seed: int = 0) -> None:
        self.window = window
        self.n_neighbors = n_neighbors
        self.max_samples = max_samples
        self.seed = seed

    def _fit_flat(self, flat: np.ndarray) -> None:
        if len(flat) > self.max_samples:
            flat = flat[np.sort(np.random.default_rng(self.seed).choice(len(flat), self.max_samples, replace=False))]
        # The reference samples are the model: an array, so the detector saves and loads as data.
        self.reference_ = np.asarray(flat, dtype=np.float32)

    def _score_flat(self, flat: np.ndarray) -> np.ndarray:
        index = NearestNeighbors(n_neighbors=min(self.n_neighbors, len(self.reference_))).fit(self.reference_)
        distances, _ = index.kneighbors(flat)
        return np.asarray(distances[:, -1], dtype=np.float64)


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

    def decision_function(self, X: Any) -> np.ndarray:
        if getattr(self, "model_", None) is None:
            raise VigilInputError(f"{self.name}: fit the detector first")
        arr = newest_rows(X, self.window, name=self.name)
        self._check_features(arr)
        errors = self._errors(arr)
        ref = self.train_errors_
        quantile = np.searchsorted(ref, errors, side="right") / len(ref)
        beyond = np.log1p(np.maximum(errors - ref[-1], 0.0) / max(ref[-1], 1e-12))
        return quantile + beyond


def labelled_windows(X: Any, y: np.ndarray | None, *, name: str) -> tuple[Any, np.ndarray]:
    """Windows and their class labels (0 normal) for a supervised detector; refuses data without a fault."""
    labels = np.asarray(X.labels if isinstance(X, WindowSet) and y is None else y if y is not None else [])
    n = len(X) if isinstance(X, WindowSet) else len(np.asarray(X))
    if labels.shape != (n,):
        raise VigilInputError(f"{name}: a supervised detector needs one label per window (0 normal, k fault class k)")
    if not (labels > 0).any() or not (labels == 0).any():
        raise VigilInputError(f"{name}: training data needs both normal and anomalous windows")
    return X, labels.astype(np.int64)


def features_of(X: Any, history: int, recent: int, *, name: str) -> np.ndarray:
    """Window features of every window in ``X`` (windows or a WindowSet), computed a batch at a time."""
    if isinstance(X, WindowSet):
        if X.length < history:
            raise VigilInputError(f"{name}: needs windows of {history} rows, got {X.length}")
        parts = [window_features(X.take(np.arange(s, min(s + BATCH, len(X))), last=history), recent)
                 for s in range(0, len(X), BATCH)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)
    arr = newest_rows(X, history, name=name)
    return window_features(arr, recent)


def thin_normal(labels: np.ndarray, max_samples: int | None, seed: int) -> tuple[np.ndarray, float]:
    """Positions of the windows to train on (every anomalous one, normal ones thinned at random to fit
    ``max_samples``) and the weight a kept normal window carries (the thinning factor)."""
    everything = np.arange(len(labels))
    if max_samples is None or len(labels) <= max_samples:
        return everything, 1.0
    normal = np.flatnonzero(labels == 0)
    room = max(max_samples - (len(labels) - len(normal)), 1)
    if room >= len(normal):
        return everything, 1.0
    kept = np.random.default_rng(seed).choice(normal, room, replace=False)
    return np.sort(np.concatenate([np.flatnonzero(labels > 0), kept])), len(normal) / room


class GradientBoostingDetector(BaseDetector):
    """Supervised baseline: gradient-boosted trees on the window features (see module docstring)."""

    name: ClassVar[str] = "gbm"
    supervised: ClassVar[bool] = True

    def __init__(self, history: int = 144, recent: int = 10, max_iter: int = 200, learning_rate: float = 0.1,
                 max_leaf_nodes: int = 31, max_samples: int | None = MAX_FIT_SAMPLES, seed: int = 0) -> None:
        self.history = history
        self.recent = recent
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.max_samples = max_samples
        self.seed = seed

    def fit(self, X: Any, y: np.ndarray | None = None) -> Self:
        X, labels = labelled_windows(X, y, name=self.name)
        keep, normal_weight = thin_normal(labels, self.max_samples, self.seed)
        if isinstance(X, WindowSet):
            features = np.concatenate([window_features(X.take(keep[s:s + BATCH], last=self.history), self.recent)
                                       for s in range(0, len(keep), BATCH)])
        else:
            features = features_of(np.asarray(X)[keep], self.history, self.recent, name=self.name)
        labels = labels[keep]
        weight = np.where(labels == 0, normal_weight, 1.0)
        self.model_ = HistGradientBoostingClassifier(max_iter=self.max_iter, learning_rate=self.learning_rate,
                                                     max_leaf_nodes=self.max_leaf_nodes, random_state=self.seed,
                                                     early_stopping=False).fit(features, labels,
                                                                               sample_weight=weight)
        self.n_features_in_ = features.shape[1]
        self.threshold_ = 0.5
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        if getattr(self, "model_", None) is None:
            raise VigilInputError(f"{self.name}: fit the detector first")
        features = features_of(X, self.history, self.recent, name=self.name)
        if features.shape[1] != self.n_features_in_:
            raise VigilInputError(f"{self.name}: expected {self.n_features_in_ // 6} metrics (as at fit time), "
                                  f"got {features.shape[1] // 6}")
        normal = list(self.model_.classes_).index(0)
        return 1.0 - self.model_.predict_proba(features)[:, normal].astype(np.float64)


class _SequenceClassifier(nn.Module):
    def __init__(self, n_features: int, hidden: int, n_classes: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, batch_first=True)
        self.out = nn.Linear(hidden, n_classes)

    def forward(self, window: torch.Tensor) -> torch.Tensor:
        states, _ = self.lstm(window)
        return self.out(states[:, -1, :])


class LSTMClassifierDetector(_FlatWindowDetector):
    """Supervised baseline: LSTM classifier over the newest ``window`` rows (see module docstring)."""

    name: ClassVar[str] = "lstm_clf"
    supervised: ClassVar[bool] = True

    def __init__(self, window: int = 30, hidden: int = 32, epochs: int = 4, steps_per_epoch: int = 150,
                 batch_size: int = 256, lr: float = 3e-3, seed: int = 0) -> None:
        self.window = window
        self.hidden = hidden
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.batch_size = batch_size
        self.lr = lr
        self.seed = seed

    def _batch(self, X: Any, index: np.ndarray) -> torch.Tensor:
        arr = X.take(index, last=self.window) if isinstance(X, WindowSet) else newest_rows(
            np.asarray(X)[index], self.window, name=self.name)
        return torch.from_numpy(((arr - self.mean_) / self.std_).astype(np.float32))

    def fit(self, X: Any, y: np.ndarray | None = None) -> Self:
        X, labels = labelled_windows(X, y, name=self.name)
        rng = np.random.default_rng(self.seed)
        sample = np.sort(rng.choice(len(labels), min(len(labels), MAX_FIT_SAMPLES), replace=False))
        rows = (X.take(sample, last=self.window) if isinstance(X, WindowSet)
                else newest_rows(np.asarray(X)[sample], self.window, name=self.name))
        self.n_features_ = rows.shape[2]
        self.mean_ = rows.reshape(-1, rows.shape[2]).mean(axis=0)
        std = rows.reshape(-1, rows.shape[2]).std(axis=0)
        self.std_ = np.where(std < 1e-6, 1.0, std)
        n_classes = int(labels.max()) + 1
        counts = np.bincount(labels, minlength=n_classes).astype(np.float64)
        # Balanced class weights: without them one anomaly class at a few per cent is never predicted.
        weight = torch.tensor(len(labels) / (n_classes * np.maximum(counts, 1.0)), dtype=torch.float32)
        torch.manual_seed(self.seed)
        self.model_ = _SequenceClassifier(self.n_features_, self.hidden, n_classes)
        optimiser = torch.optim.Adam(self.model_.parameters(), lr=self.lr)
        steps = min(self.steps_per_epoch, max(1, len(labels) // self.batch_size))
        self.model_.train()
        for _ in range(self.epochs):
            order = rng.permutation(len(labels))
            for step in range(steps):
                idx = np.sort(order[step * self.batch_size:(step + 1) * self.batch_size])
                logits = self.model_(self._batch(X, idx))
                loss = nn.functional.cross_entropy(logits, torch.from_numpy(labels[idx]), weight=weight)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        self.model_.eval()
        self.threshold_ = 0.5
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        if getattr(self, "model_", None) is None:
            raise VigilInputError(f"{self.name}: fit the detector first")
        n = len(X) if isinstance(X, WindowSet) else len(newest_rows(X, self.window, name=self.name))
        if not isinstance(X, WindowSet):
            self._check_features(newest_rows(X, self.window, name=self.name))
        out = []
        with torch.no_grad():
            for start in range(0, n, BATCH):
                logits = self.model_(self._batch(X, np.arange(start, min(start + BATCH, n))))
                out.append(1.0 - torch.softmax(logits, dim=1)[:, 0].numpy())
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


BASELINES: dict[str, type[BaseDetector]] = {
    cls.name: cls for cls in (LSTMDetector, PCADetector, IForestDetector, KMeansDetector, OwnHistoryKMeansDetector,
                              KNNDetector, RandomDetector, GradientBoostingDetector, LSTMClassifierDetector)
}
