"""The detector contracts, in the style of PyOD's ``BaseDetector`` and scikit-learn's estimators.

- ``BaseDetector`` scores arrays: hyper-parameters in ``__init__`` (so ``get_params`` comes from scikit-learn's
  ``BaseEstimator``), ``fit(X, y=None)``, ``decision_function(X)`` (higher is more anomalous), ``predict(X)``
  (0/1 against ``threshold_``), learned state in attributes ending in ``_``, ``save`` / ``load`` on the class.
- ``StreamDetector`` turns what arrives at one tick (one metric frame per family and the events since the last
  tick) into ``Anomaly`` records: ``update`` per tick, ``close`` at the end of the stream. Rules implement it
  directly; an array detector joins the stream through an adapter that keeps its windows.

A new detector is a new class, never a new code path in the pipeline.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
from sklearn.base import BaseEstimator

from vigil.model import Anomaly, Event, VigilInputError
from vigil.store.metrics import MetricFrame

# What ``BaseDetector.save`` writes into its directory: hyper-parameters and JSON-valued fitted attributes,
# and the array-valued fitted attributes (read back with allow_pickle=False: no code runs from a model file).
PARAMS_FILE = "detector.json"
ARRAYS_FILE = "fitted.npz"
_JSON_SCALARS = (str, int, float, bool, type(None))


class BaseDetector(BaseEstimator, ABC):
    """Array detector: ``X`` is (n_samples, n_features) or (n_windows, window, n_features)."""

    name: ClassVar[str] = "detector"

    @abstractmethod
    def fit(self, X: np.ndarray, y: np.ndarray | None = None) -> Self:
        """Learn from ``X`` (``y`` where labels exist); sets the attributes ending in ``_``."""

    @abstractmethod
    def decision_function(self, X: np.ndarray) -> np.ndarray:
        """Anomaly score per sample or window; higher means more anomalous."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        threshold = getattr(self, "threshold_", None)
        if threshold is None:
            raise VigilInputError(f"{self.name}: no threshold_ set; fit or calibrate the detector first")
        return (self.decision_function(X) >= threshold).astype(np.int8)

    def fitted_attributes(self) -> dict[str, Any]:
        """The learned state: public attributes ending in ``_`` (scikit-learn's convention)."""
        return {k: v for k, v in vars(self).items() if k.endswith("_") and not k.startswith("_")}

    def save(self, path: Path) -> None:
        """Write hyper-parameters and learned state into the directory ``path``.

        Fitted attributes must be numpy arrays or JSON values; a detector holding anything else (a torch module)
        overrides ``save`` and ``load``.
        """
        fitted = self.fitted_attributes()
        if not fitted:
            raise VigilInputError(f"{self.name}: cannot save an unfitted detector; fit it first")
        arrays: dict[str, Any] = {k: v for k, v in fitted.items() if isinstance(v, np.ndarray)}
        values = {k: v for k, v in fitted.items() if k not in arrays}
        for key, value in values.items():
            if not _is_json_value(value):
                raise TypeError(f"{type(self).__name__}.{key} is a {type(value).__name__}: neither an array nor a "
                                "JSON value, so this detector must override save() and load()")
        path.mkdir(parents=True, exist_ok=True)
        np.savez(path / ARRAYS_FILE, **arrays)
        meta = {"detector": _class_path(type(self)), "params": self.get_params(deep=False), "fitted": values}
        tmp = path / (PARAMS_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.replace(path / PARAMS_FILE)

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read a detector that ``save`` wrote; refuses another class's file."""
        meta_path = path / PARAMS_FILE
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            raise VigilInputError(f"no saved detector at {path} ({PARAMS_FILE} missing)") from None
        except json.JSONDecodeError as err:
            raise VigilInputError(f"{meta_path}: corrupt detector file ({err.msg})") from None
        if not isinstance(meta, dict) or not {"detector", "params", "fitted"} <= meta.keys():
            raise VigilInputError(f"{meta_path}: expected an object with detector, params and fitted")
        if meta["detector"] != _class_path(cls):
            raise VigilInputError(f"{meta_path}: holds a {meta['detector']}, not a {_class_path(cls)}")
        try:
            detector = cls(**meta["params"])
        except TypeError as err:
            raise VigilInputError(f"{meta_path}: parameters do not fit {cls.__name__} ({err})") from None
        try:
            with np.load(path / ARRAYS_FILE, allow_pickle=False) as arrays:
                fitted = {**meta["fitted"], **{k: arrays[k] for k in arrays.files}}
        except (OSError, ValueError) as err:
            raise VigilInputError(f"{path / ARRAYS_FILE}: missing or corrupt ({err})") from None
        for key, value in fitted.items():
            if not key.endswith("_"):
                raise VigilInputError(f"{meta_path}: {key!r} is not a fitted attribute (they end in '_')")
            setattr(detector, key, value)
        return detector


class Detector(BaseDetector):
    """Array detectors written against the first form of the contract, which named the scores ``score``.

    ``decision_function`` is ``score`` here; a detector that implements ``decision_function`` itself derives
    from ``BaseDetector``.
    """

    def fit(self, X: np.ndarray, y: np.ndarray | None = None) -> Self:
        return self

    @abstractmethod
    def score(self, X: np.ndarray) -> np.ndarray:
        """Anomaly score per sample or window; higher means more anomalous."""

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        return self.score(X)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_json_value(value: Any) -> bool:
    if isinstance(value, _JSON_SCALARS):
        return True
    if isinstance(value, list | tuple):
        return all(_is_json_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_value(v) for k, v in value.items())
    return False


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


class StreamDetector(ABC):
    """What the pipeline calls once per tick, and once when the stream ends."""

    name: str

    @abstractmethod
    def update(self, frames: Sequence[MetricFrame], events: Sequence[Event]) -> list[Anomaly]:
        """Anomalies opened in this tick's frames (one per metric family) and the events since the last tick;
        an anomaly that is still open grows its ``end`` in place."""

    @abstractmethod
    def close(self) -> list[Anomaly]:
        """End the stream: close what is still open and return every anomaly the detector finished."""
