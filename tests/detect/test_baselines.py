"""Baselines behind the detector interface: they fit, score, rank an obvious fault above noise, refuse bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from vigil.detect.base import BaseDetector
from vigil.detect.learned.baselines import BASELINES, LSTMDetector, RandomDetector
from vigil.detect.learned.windows import WindowSet
from vigil.model import VigilInputError

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
    params = {"lstm": {"epochs": 3}, "gbm": {"history": 30}, "lstm_clf": {"epochs": 6}}.get(name, {})
    det: BaseDetector = BASELINES[name](seed=0, **params)
    det.fit(X, y)
    Xt, yt = sine_windows(300, seed=1)
    scores = det.decision_function(Xt)
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
    clean_ap = average_precision_score(yt, det.decision_function(Xt))
    assert clean_ap >= average_precision_score(yt, contaminated.decision_function(Xt)) - 0.05


def test_lstm_keeps_the_mission_settings() -> None:
    X, y = sine_windows(400, seed=0)
    det = LSTMDetector(epochs=2).fit(X, y)
    assert (det.window, det.stride, det.threshold_) == (30, 5, 0.85)
    train_scores = det.decision_function(X[y == 0])
    # About 15 % of normal windows sit above the 0.85 quantile of the training errors.
    assert 0.03 < (train_scores >= 0.85).mean() < 0.35
    assert det.predict(X[:10]).dtype == np.int8


def test_bad_input_is_refused() -> None:
    X, y = sine_windows(200, seed=0)
    det = BASELINES["pca"](seed=0).fit(X, y)
    with pytest.raises(VigilInputError, match="expected 3 features"):
        det.decision_function(X[:, :, :2])
    bad = X.copy()
    bad[0, -1, 0] = np.nan
    with pytest.raises(VigilInputError, match="NaN"):
        det.decision_function(bad)
    with pytest.raises(VigilInputError, match="30 rows"):
        LSTMDetector().fit(X[:, -10:, :])
    with pytest.raises(VigilInputError, match="fit the detector"):
        RandomDetector().decision_function(X)


@pytest.mark.parametrize("name", ["gbm", "lstm_clf"])
def test_supervised_baselines_need_labelled_faults(name: str) -> None:
    X, y = sine_windows(200, seed=0)
    det = BASELINES[name](seed=0, **({"history": 30} if name == "gbm" else {}))
    assert getattr(det, "supervised", False)
    with pytest.raises(VigilInputError, match="normal and anomalous"):
        det.fit(X, np.zeros(len(X), dtype=int))
    with pytest.raises(VigilInputError, match="one label per window"):
        det.fit(X)
    fitted = det.fit(WindowSet.from_array(X, y))
    with pytest.raises(VigilInputError, match="fit the detector"):
        BASELINES[name](seed=0).decision_function(X)
    assert fitted.predict(X[:5]).shape == (5,)


def test_window_features_read_the_deviation_from_the_window_past() -> None:
    from vigil.detect.learned.features import FEATURES_PER_METRIC, feature_names, window_features

    window = np.zeros((1, 20, 2), dtype=np.float32)
    window[0, :, 0] = np.tile([-1.0, 1.0], 10)
    window[0, -1, 0] = 5.0
    features = window_features(window, recent=4).reshape(2, len(FEATURES_PER_METRIC))
    named = dict(zip(FEATURES_PER_METRIC, features[0], strict=True))
    assert named["last"] == 5.0 and named["z_last"] == pytest.approx(5.0 / 1.1, rel=1e-5)
    assert (features[1] == [0, 0, 0, 0, 0, 0]).all()
    assert feature_names(["a"])[3] == "a:z_last"
    with pytest.raises(VigilInputError, match="longer than it"):
        window_features(window, recent=20)


@pytest.mark.parametrize("name", ["kmeans", "knn"])
def test_array_baselines_save_and_load_as_data(name: str, tmp_path: Path) -> None:
    X, y = sine_windows(300, seed=0)
    det = BASELINES[name](seed=0).fit(X, y)
    det.save(tmp_path / name)
    back = type(det).load(tmp_path / name)
    assert back.get_params() == det.get_params()
    np.testing.assert_allclose(back.decision_function(X[:20]), det.decision_function(X[:20]), rtol=1e-6)


def test_gbm_thins_normal_windows_keeps_every_fault_and_the_prior() -> None:
    from vigil.detect.learned.baselines import GradientBoostingDetector, thin_normal

    labels = np.r_[np.zeros(900, dtype=int), np.ones(100, dtype=int)]
    keep, weight = thin_normal(labels, 300, seed=0)
    assert len(keep) == 300 and (labels[keep] == 1).sum() == 100
    assert weight == pytest.approx(900 / 200)
    assert thin_normal(labels, None, seed=0)[1] == 1.0 and len(thin_normal(labels, 5000, seed=0)[0]) == 1000
    X, y = sine_windows(400, seed=0)
    capped = GradientBoostingDetector(history=30, max_iter=20, max_samples=150, seed=0).fit(X, y)
    Xt, yt = sine_windows(300, seed=1)
    assert average_precision_score(yt > 0, capped.decision_function(Xt)) > 0.5


def test_own_history_kmeans_fits_on_the_older_history_and_reads_against_the_newer() -> None:
    from vigil.detect.learned.baselines import OwnHistoryKMeansDetector

    rng = np.random.default_rng(0)
    history = rng.normal(0.0, 0.1, size=(200, 10, 3)).astype(np.float32)
    history[100:] += 50.0  # the newer half: far from anything the fit may see
    det = OwnHistoryKMeansDetector(seed=0)
    near, newer = det.score_own_history(history[:5] + 0.01, history)
    far, _ = det.score_own_history(np.full((1, 10, 3), 5.0, dtype=np.float32), history)
    # Fitted on the older half only: its own windows sit near a centroid, the newer half is scored out of sample.
    assert near.max() < 1.0 and newer.min() > 100.0 and far[0] > near.max() * 10 and len(newer) == 100
    assert getattr(det, "centroids_", None) is None  # each machine gets a fresh copy; the detector keeps none
    with pytest.raises(VigilInputError, match="at least 4 history windows"):
        det.score_own_history(history[:3], history[:3])
