"""The detector contracts: what every array detector and every stream detector promises."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import numpy as np
import pytest

from vigil.detect.base import ARRAYS_FILE, PARAMS_FILE, BaseDetector, StreamDetector
from vigil.detect.learned.baselines import BASELINES, RandomDetector
from vigil.detect.learned.tce import TCEDetector
from vigil.detect.rules import RuleDetector
from vigil.detect.stream import LearnedStreamDetector
from vigil.diagnose.peers import PeerDifferenceDetector
from vigil.model import Anomaly, Event, VigilInputError
from vigil.store.metrics import MetricFrame


class ZScoreDetector(BaseDetector):
    """Distance from the training mean in standard deviations; threshold at a training quantile."""

    name = "zscore"

    def __init__(self, quantile: float = 0.99) -> None:
        self.quantile = quantile

    def fit(self, X: np.ndarray, y: np.ndarray | None = None) -> Self:
        self.mean_ = X.mean(axis=0)
        self.std_ = X.std(axis=0)
        self.decision_scores_ = self.decision_function(X)
        self.threshold_ = float(np.quantile(self.decision_scores_, self.quantile))
        self.features_ = [f"m{i}" for i in range(X.shape[1])]
        return self

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        return np.abs((X - self.mean_) / self.std_).max(axis=1)


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    normal = rng.normal(size=(500, 3))
    shifted = rng.normal(size=(20, 3)) + np.array([0.0, 8.0, 0.0])
    return normal, shifted


def test_the_contracts_are_abstract() -> None:
    with pytest.raises(TypeError):
        BaseDetector()  # type: ignore[abstract]

    class NoScores(BaseDetector):
        def fit(self, X: np.ndarray, y: np.ndarray | None = None) -> Self:
            return self

    with pytest.raises(TypeError, match="decision_function"):
        NoScores()  # type: ignore[abstract]

    class NeverCloses(StreamDetector):
        name = "never"

        def update(self, frames: Sequence[MetricFrame], events: Sequence[Event]) -> list[Anomaly]:
            return []

    with pytest.raises(TypeError, match="close"):
        NeverCloses()  # type: ignore[abstract]


def test_fit_sets_trailing_underscore_state_and_predict_uses_the_threshold(data) -> None:  # type: ignore[no-untyped-def]
    normal, shifted = data
    det = ZScoreDetector(quantile=0.995)
    assert det.get_params() == {"quantile": 0.995}
    with pytest.raises(VigilInputError, match="threshold_"):
        det.predict(normal)
    det.fit(normal)
    assert set(det.fitted_attributes()) == {"mean_", "std_", "decision_scores_", "threshold_", "features_"}
    assert det.predict(shifted).tolist() == [1] * len(shifted)
    assert det.predict(normal).mean() <= 0.01


def test_save_and_load_round_trip_without_pickle(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    normal, shifted = data
    det = ZScoreDetector(quantile=0.9).fit(normal)
    det.save(tmp_path / "z")
    back = ZScoreDetector.load(tmp_path / "z")
    assert back.get_params() == det.get_params()
    assert back.features_ == det.features_
    np.testing.assert_array_equal(back.decision_function(shifted), det.decision_function(shifted))
    np.testing.assert_array_equal(back.predict(normal), det.predict(normal))


def test_load_refuses_another_class_a_corrupt_file_and_pickled_arrays(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    normal, _ = data
    ZScoreDetector().fit(normal).save(tmp_path / "z")
    with pytest.raises(VigilInputError, match="not a"):
        RandomDetector.load(tmp_path / "z")
    with pytest.raises(VigilInputError, match="missing"):
        ZScoreDetector.load(tmp_path / "nothing")
    meta = json.loads((tmp_path / "z" / PARAMS_FILE).read_text())
    meta["params"] = {"quantile": 0.9, "bogus": 1}
    (tmp_path / "z" / PARAMS_FILE).write_text(json.dumps(meta))
    with pytest.raises(VigilInputError, match="parameters"):
        ZScoreDetector.load(tmp_path / "z")
    (tmp_path / "z" / PARAMS_FILE).write_text("{not json")
    with pytest.raises(VigilInputError, match="corrupt"):
        ZScoreDetector.load(tmp_path / "z")

    # An object array would be unpickled on load: refused, so no code runs from a model file.
    det = ZScoreDetector().fit(normal)
    det.mean_ = np.array([{"x": 1}], dtype=object)
    det.save(tmp_path / "obj")
    with pytest.raises(VigilInputError, match=ARRAYS_FILE):
        ZScoreDetector.load(tmp_path / "obj")


def test_state_that_is_neither_array_nor_json_must_override_save(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    normal, _ = data
    det = ZScoreDetector().fit(normal)
    det.model_ = object()
    with pytest.raises(TypeError, match="override save"):
        det.save(tmp_path / "z")
    with pytest.raises(VigilInputError, match="unfitted"):
        ZScoreDetector().save(tmp_path / "empty")


def test_a_fitted_baseline_round_trips_through_the_generic_save(tmp_path: Path) -> None:
    X = np.random.default_rng(1).normal(size=(64, 1, 4))
    det = RandomDetector(seed=3).fit(X)
    det.save(tmp_path / "random")
    back = RandomDetector.load(tmp_path / "random")
    np.testing.assert_array_equal(back.predict(X), det.predict(X))


def test_the_product_detectors_declare_the_contracts() -> None:
    for cls in (*BASELINES.values(), TCEDetector):
        assert issubclass(cls, BaseDetector), cls
    for stream in (RuleDetector, PeerDifferenceDetector, LearnedStreamDetector):
        assert issubclass(stream, StreamDetector), stream
