"""Baselines behind the detector interface: they fit, score, rank an obvious fault above noise, refuse bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from vigil.detect.base import Detector
from vigil.detect.learned.baselines import BASELINES, LSTMDetector, RandomDetector
from vigil.model import VigilInputError
from vigil_eval.datasets import WindowSet

torch.set_num_threads(1)


def sine_windows(n: int, seed: int, window: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Three correlated sines with noise; anomalous windows break the correlation in their newest rows."""
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1))
    t = phase + np.linspace(0, 3, window)[None, :]
    X = np.stack([np.sin(t), np.sin(t) * 0.5, np.cos(t)], axis=2) + rng.normal(0, 0.05, size=(n, window, 3))
    y = (rng.random(n) < 0.1).astype(int)
    X[y == 1, -3:, 1] += 1.5
    return X.astype(np.float32), y


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baseline_fits_and_scores(name: str) -> None:
    X, y = sine_windows(600, seed=0)
    params = {"epochs": 3} if name == "lstm" else {}
    det: Detector = BASELINES[name](seed=0, **params)
    det.fit(X, y)
    Xt, yt = sine_windows(300, seed=1)
    scores = det.score(Xt)
    assert scores.shape == (300,) and np.isfinite(scores).all()
    ap = average_precision_score(yt, scores)
    if name == "random":
        assert ap < 0.3
    else:
        assert ap > 0.6, f"{name} AP {ap:.2f}"


def test_unsupervised_baselines_fit_on_normal_windows_only() -> None:
    X, y = sine_windows(400, seed=0)
    ws = WindowSet.from_array(X, y)
    det = BASELINES["kmeans"](seed=0).fit(ws)
    contaminated = BASELINES["kmeans"](seed=0).fit(X)
    Xt, yt = sine_windows(300, seed=1)
    assert average_precision_score(yt, det.score(Xt)) >= average_precision_score(yt, contaminated.score(Xt)) - 0.05


def test_lstm_keeps_the_mission_settings() -> None:
    X, y = sine_windows(400, seed=0)
    det = LSTMDetector(epochs=2).fit(X, y)
    assert (det.window, det.stride, det.threshold_) == (30, 5, 0.85)
    train_scores = det.score(X[y == 0])
    # About 15 % of normal windows sit above the 0.85 quantile of the training errors.
    assert 0.03 < (train_scores >= 0.85).mean() < 0.35
    assert det.predict(X[:10]).dtype == np.int8


def test_bad_input_is_refused() -> None:
    X, y = sine_windows(200, seed=0)
    det = BASELINES["pca"](seed=0).fit(X, y)
    with pytest.raises(VigilInputError, match="expected 3 features"):
        det.score(X[:, :, :2])
    bad = X.copy()
    bad[0, -1, 0] = np.nan
    with pytest.raises(VigilInputError, match="NaN"):
        det.score(bad)
    with pytest.raises(VigilInputError, match="30 rows"):
        LSTMDetector().fit(X[:, -10:, :])
    with pytest.raises(VigilInputError, match="fit the detector"):
        RandomDetector().score(X)
