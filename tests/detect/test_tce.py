"""TCE: shapes, ablation switches, learning a toy fault, save / load round trip, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from vigil.detect.learned.tce import (
    PartReadings,
    TCEDetector,
    TemporalContextEncoder,
    agreement_weights,
    combine_parts,
    load_detector,
    save_detector,
    tail_standardise,
)
from vigil.detect.learned.windows import WindowSet
from vigil.model import VigilInputError

torch.set_num_threads(1)


def toy_windows(n: int, seed: int, history: int = 48, features: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Noise; class 1 = a level shift in the last 8 rows of metric 0, class 2 = a slow ramp of metric 1 over
    the whole history (a trend that the recent window alone cannot see well)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, history, features)).astype(np.float32)
    y = rng.choice(3, size=n, p=[0.8, 0.1, 0.1])
    X[y == 1, -8:, 0] += 3.0
    X[y == 2, :, 1] += np.linspace(0.0, 4.0, history, dtype=np.float32)
    return X, y


def small_tce(**kw: object) -> TCEDetector:
    params: dict[str, object] = dict(recent=12, history=48, scales=(6, 12), hidden=16, epochs=4, batch_size=64,
                                     seed=0)
    params.update(kw)
    return TCEDetector(**params)  # type: ignore[arg-type]


@pytest.mark.parametrize(("use_history", "use_context"), [(True, True), (False, True), (True, False)])
def test_forward_shapes_for_every_ablation(use_history: bool, use_context: bool) -> None:
    model = TemporalContextEncoder(5, 4, recent=10, history=60, scales=(6, 20), hidden=16, n_context=3,
                                   use_history=use_history, use_context=use_context)
    out = model(torch.randn(7, 60, 5), torch.randn(7, 3))
    assert out.shape == (7, 4)


def test_tce_learns_recent_and_trend_faults() -> None:
    X, y = toy_windows(1200, seed=0)
    Xv, yv = toy_windows(300, seed=1)
    det = small_tce().fit(X, y, validation=WindowSet.from_array(Xv, yv), classes=["normal", "shift", "ramp"])
    Xt, yt = toy_windows(300, seed=2)
    scores = det.decision_function(Xt)
    assert average_precision_score(yt > 0, scores) > 0.9
    pred = det.predict_class(Xt)
    for k in (1, 2):
        assert (pred[yt == k] == k).mean() > 0.7
    assert det.report_.validation_metric == "macro_f1" and det.report_.best_epoch >= 1


def test_save_load_round_trip(tmp_path: Path) -> None:
    X, y = toy_windows(300, seed=0)
    det = small_tce(epochs=1).fit(X, y, features=["a", "b", "c", "d"])
    save_detector(det, tmp_path / "m")
    back = load_detector(tmp_path / "m")
    assert back.features_ == ["a", "b", "c", "d"] and back.classes_ == det.classes_
    np.testing.assert_allclose(back.decision_function(X[:50]), det.decision_function(X[:50]), rtol=1e-5, atol=1e-6)
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    assert meta["format_version"] == 1 and len(meta["scaler"]["mean"]) == 4


def test_window_context_reads_the_window_features_and_round_trips(tmp_path: Path) -> None:
    X, y = toy_windows(400, seed=0)
    det = small_tce(epochs=2, window_context=True).fit(X, y)
    assert det.n_context_ == 4 * 6
    det.save(tmp_path / "m")
    back = TCEDetector.load(tmp_path / "m")
    assert back.window_context and back.n_context_ == 24
    np.testing.assert_allclose(back.decision_function(X[:40]), det.decision_function(X[:40]), rtol=1e-5, atol=1e-6)
    supervised, novelty = det.score_parts(X[:40])
    assert novelty is not None and np.allclose(supervised, 1 - det.predict_proba(X[:40])[:, 0])


def test_load_refuses_missing_or_mismatched_models(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="no trained model"):
        load_detector(tmp_path / "nothing")
    X, y = toy_windows(200, seed=0)
    save_detector(small_tce(epochs=1).fit(X, y), tmp_path / "m")
    meta_path = tmp_path / "m" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["features"] = meta["features"] + ["extra"]
    meta["scaler"]["mean"].append(0.0)
    meta["scaler"]["std"].append(1.0)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(VigilInputError, match="does not match"):
        load_detector(tmp_path / "m")
    meta["format_version"] = 99
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(VigilInputError, match="format version"):
        load_detector(tmp_path / "m")


def test_bad_input_gets_a_clear_error() -> None:
    X, y = toy_windows(200, seed=0)
    det = small_tce(epochs=1).fit(X, y)
    with pytest.raises(VigilInputError, match="expected 4 features"):
        det.decision_function(X[:, :, :3])
    with pytest.raises(VigilInputError, match="48"):
        det.decision_function(X[:, -20:, :])
    bad = X[:5].copy()
    bad[0, 3, 1] = np.nan
    with pytest.raises(VigilInputError, match="NaN"):
        det.decision_function(bad)
    with pytest.raises(VigilInputError, match="labels"):
        small_tce().fit(X)


def test_ensemble_averages_member_logits_and_round_trips(tmp_path: Path) -> None:
    X, y = toy_windows(400, seed=0)
    Xv, yv = toy_windows(150, seed=1)
    det = small_tce(epochs=2, members=2, seed=1).fit(X, y, validation=WindowSet.from_array(Xv, yv))
    assert det.member_seeds() == [2, 3]
    members = list(det.model_.members)
    assert len(members) == 2
    # Members start from different seeds, so they differ; the ensemble's logits are their mean.
    window = torch.from_numpy(det.scaler_.transform(X[:20]))
    with torch.no_grad():
        a, b, both = members[0](window), members[1](window), det.model_(window)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(both, (a + b) / 2)
    # The report counts both members' epochs and scores the ensemble on validation data.
    assert det.report_.epochs_run == sum(1 for h in det.report_.history)
    assert np.isfinite(det.report_.best_validation)
    save_detector(det, tmp_path / "ens")
    back = load_detector(tmp_path / "ens")
    np.testing.assert_allclose(back.decision_function(X[:50]), det.decision_function(X[:50]), rtol=1e-5, atol=1e-6)
    with pytest.raises(VigilInputError, match="members"):
        small_tce(members=0).fit(X, y)


def test_trailing_mean_is_causal_and_smooths() -> None:
    from vigil.detect.learned.tce import trailing_mean

    scores = np.array([0.0, 0.0, 9.0, 0.0, 0.0, 3.0])
    smoothed = trailing_mean(scores, 3)
    assert np.allclose(smoothed, [0.0, 0.0, 3.0, 3.0, 3.0, 1.0])
    # Causal: a change at row 5 moves no earlier score.
    later = scores.copy()
    later[5] = 100.0
    assert np.allclose(trailing_mean(later, 3)[:5], smoothed[:5])
    assert np.array_equal(trailing_mean(scores, 1), scores)


def test_memory_and_mix_survive_save_and_load_and_rank_a_new_fault(tmp_path: Path) -> None:
    X, y = toy_windows(400, seed=0)
    det = small_tce(epochs=1, prototypes=8, memory=6, memory_rows=4, embedding=5, mix=(1.0, 1.0, 1.0, 1.0),
                    smooth=3, combine="agree").fit(X, y)
    det.choice_ = {"scaling": "fleet", "variant": "sup+nov+mem+emb smooth=3"}
    normal_history = np.random.default_rng(5).normal(size=(200, 48, 4)).astype(np.float32)
    save_detector(det, tmp_path / "m")
    back = load_detector(tmp_path / "m")
    assert back.mix == (1.0, 1.0, 1.0, 1.0, 0.0) and back.smooth == 3 and back.memory_.shape == det.memory_.shape
    assert back.combine == "agree"
    # A model saved before the combination rules reads as the rank mean.
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    del meta["params"]["combine"]
    (tmp_path / "m" / "meta.json").write_text(json.dumps(meta))
    assert load_detector(tmp_path / "m").combine == "rank"
    assert back.embedding_memory_.shape == det.embedding_memory_.shape == (5, det.hidden)
    np.testing.assert_allclose(back.embedding_distance(X[:40]), det.embedding_distance(X[:40]), rtol=1e-5, atol=1e-6)
    assert back.choice_ == det.choice_
    unsmoothed = det.relative_score(X[:40], normal_history, smooth=1)
    assert not np.allclose(unsmoothed, det.relative_score(X[:40], normal_history))
    np.testing.assert_allclose(back.relative_score(X[:40], normal_history), det.relative_score(X[:40], normal_history),
                               rtol=1e-5, atol=1e-6)
    # A fault no training window showed (metric 3 jumps): the memory part sees it without labels.
    fresh, _ = toy_windows(100, seed=9)
    fresh[50:, -4:, 3] += 8.0
    memory_only = det.relative_score(fresh, normal_history, mix=(0.0, 0.0, 1.0), smooth=1)
    # A mix of three weights (models saved before the embedding part) reads as the embedding weighing 0.
    assert np.array_equal(memory_only, det.relative_score(fresh, normal_history, mix=(0.0, 0.0, 1.0, 0.0), smooth=1))
    assert memory_only[50:].min() > memory_only[:50].max() * 0.5 and memory_only[50:].mean() > 1.0
    with pytest.raises(VigilInputError, match="lacks"):
        small_tce(epochs=1).fit(X, y).relative_score(X[:10], normal_history, mix=(0.0, 0.0, 1.0))


def test_embedding_part_is_the_distance_in_the_classifiers_hidden_space() -> None:
    X, y = toy_windows(400, seed=0)
    det = small_tce(epochs=2, embedding=6).fit(X, y)
    assert det.score_components_available()[0] == "supervised" and "embedding" in det.score_components_available()
    encoder = next(m for m in det.model_.modules() if isinstance(m, TemporalContextEncoder))
    window = torch.from_numpy(det.scaler_.transform(X[:30]))
    with torch.no_grad():
        hidden = encoder.embed(window)
        # The logits are read from the embedding: the head's last layer on it gives forward's output.
        np.testing.assert_allclose(encoder.head[3](hidden).numpy(), encoder(window).numpy(), rtol=1e-5, atol=1e-5)
    centroids = det.embedding_memory_
    expected = np.sqrt(((hidden.numpy()[:, None, :] - centroids[None]) ** 2).sum(axis=2)).min(axis=1)
    np.testing.assert_allclose(det.embedding_distance(X[:30]), expected, rtol=1e-4, atol=1e-4)
    # Windows of the fault class sit farther from the normal windows' centroids than normal windows do.
    distance = det.embedding_distance(X)
    assert distance[y > 0].mean() > distance[y == 0].mean()
    with pytest.raises(VigilInputError, match="embedding=0"):
        small_tce(epochs=1).fit(X, y).embedding_distance(X[:5])


def test_score_components_in_one_pass_equal_the_parts_one_by_one() -> None:
    X, y = toy_windows(300, seed=0)
    det = small_tce(epochs=1, prototypes=8, memory=6, memory_rows=4, embedding=5, window_context=True).fit(X, y)
    parts = det.score_components(X[:50])
    np.testing.assert_allclose(parts["supervised"], det.decision_function(X[:50]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(parts["novelty"], det.novelty(X[:50]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(parts["memory"], det.memory_distance(X[:50]), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(parts["embedding"], det.embedding_distance(X[:50]), rtol=1e-4, atol=1e-5)


def test_tail_units_read_any_scale_against_the_history() -> None:
    reference = np.arange(1001, dtype=np.float64)
    units = tail_standardise(np.array([500.0, 990.0, 1480.0]), reference)
    np.testing.assert_allclose(units, [0.0, 1.0, 2.0])
    # A probability and a distance read alike: the units do not depend on the part's scale or offset.
    np.testing.assert_allclose(tail_standardise(np.array([3.0, 7.0]) * 1e-3 + 5, reference * 1e-3 + 5),
                               tail_standardise(np.array([3.0, 7.0]), reference))
    with pytest.raises(VigilInputError, match="no history"):
        tail_standardise(np.ones(2), np.zeros(0))


def noisy_part_and_clear_part(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """A machine's history and labelled windows: the memory part shows 20 anomalies clearly beyond its
    history's tail, the supervised part is noise on this machine (no better than its own history)."""
    rng = np.random.default_rng(seed)
    labels = np.zeros(1000, dtype=bool)
    labels[rng.choice(1000, 20, replace=False)] = True
    memory = rng.normal(size=1000)
    memory[labels] = 3.2 + 0.3 * rng.normal(size=20)
    parts = {"supervised": rng.random(1000), "memory": memory}
    reference = {"supervised": rng.random(720), "memory": rng.normal(size=720)}
    return parts, reference, labels


def test_max_rule_keeps_an_anomaly_that_a_noise_part_dilutes_in_the_rank_mean() -> None:
    parts, reference, labels = noisy_part_and_clear_part()
    readings = PartReadings.read(parts, reference)
    either = combine_parts(readings, (1.0, 0.0, 1.0), "max")
    mean = combine_parts(readings, (1.0, 0.0, 1.0), "rank")
    np.testing.assert_allclose(either, np.maximum(readings.tails["supervised"], readings.tails["memory"]))
    assert average_precision_score(labels, either) > 0.8
    assert average_precision_score(labels, either) > average_precision_score(labels, mean) + 0.2


def test_agreement_weighs_down_a_part_that_ranks_the_history_unlike_the_others() -> None:
    rng = np.random.default_rng(1)
    shared = rng.normal(size=720)
    reference = {"novelty": shared + 0.3 * rng.normal(size=720), "memory": shared + 0.3 * rng.normal(size=720),
                 "supervised": rng.normal(size=720)}
    ranks = {k: np.argsort(np.argsort(v)) / 720.0 for k, v in reference.items()}
    weights = agreement_weights(ranks, {"supervised": 1.0, "novelty": 1.0, "memory": 2.0})
    assert weights["novelty"] > 0.5 and weights["memory"] > 1.0
    assert weights["supervised"] < 0.1 * weights["novelty"]
    # A part ranked against the others gets no weight; when no part agrees the given weights stay.
    against = agreement_weights({"novelty": ranks["novelty"], "memory": 1 - ranks["novelty"],
                                 "supervised": ranks["novelty"]}, {"supervised": 2.0, "novelty": 1.0, "memory": 1.0})
    assert against["memory"] == 0.0 and against["novelty"] > 0.9
    lone = {"supervised": 1.0, "memory": 2.0}
    assert agreement_weights({"supervised": ranks["novelty"], "memory": 1 - ranks["novelty"]}, lone) == lone


def test_unknown_combination_rule_is_refused() -> None:
    parts, reference, _ = noisy_part_and_clear_part()
    with pytest.raises(VigilInputError, match="unknown combination rule 'vote'"):
        combine_parts(PartReadings.read(parts, reference), (1.0, 0.0, 1.0), "vote")


def test_own_history_part_reads_a_machine_against_its_own_past_not_the_fleets(tmp_path: Path) -> None:
    """A machine whose normal level is unlike the fleet's: the fleet memory finds every window of it far, the
    own-history part (fitted on the machine's older history) finds only the departure from its own normal."""
    X, y = toy_windows(400, seed=0)
    det = small_tce(epochs=1, memory=6, memory_rows=4, own_memory=5).fit(X, y)
    assert det.score_components_available()[-1] == "own"
    rng = np.random.default_rng(3)
    history = (rng.normal(size=(200, 48, 4)) + 6.0).astype(np.float32)  # this machine sits at level 6
    fresh = (rng.normal(size=(100, 48, 4)) + 6.0).astype(np.float32)
    fresh[60:, -4:, 2] += 8.0  # its own fault, on top of its level
    labels = np.r_[np.zeros(60), np.ones(40)]
    own = det.relative_score(fresh, history, mix=(0.0, 0.0, 0.0, 0.0, 1.0))
    assert average_precision_score(labels, own) == 1.0
    assert own[:60].max() < own[60:].min()
    # Raw distances: this machine's normal windows lie near its own history's centroids and far from the
    # fleet's; read against the newer half of its history (out of sample), they sit in its middle.
    own_raw, own_ref = det.own_memory_distance(fresh, history)
    assert own_raw[:60].max() < 0.5 * det.memory_distance(fresh[:60]).min()
    assert len(own_ref) == 100 and 0.2 < np.mean(own_raw[:60] <= np.median(own_ref)) < 0.8
    # Scored against the newer half of the history it did not fit on; saved and loaded with the model.
    save_detector(det, tmp_path / "m")
    back = load_detector(tmp_path / "m")
    assert back.own_memory == 5
    np.testing.assert_allclose(back.relative_score(fresh, history, mix=(0.0, 0.0, 0.0, 0.0, 1.0)), own)
    with pytest.raises(VigilInputError, match="at least 4 history windows"):
        det.own_memory_distance(fresh, history[:3])
    with pytest.raises(VigilInputError, match="own_memory=0"):
        small_tce(epochs=1).fit(X, y).own_memory_distance(fresh, history)
