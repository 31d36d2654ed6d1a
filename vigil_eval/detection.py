"""Honest anomaly-detection metrics.

Point-wise F1 is computed at a threshold chosen on validation data only (``choose_threshold``) and never on
the test labels. AUC-PR and VUS-PR need no threshold. Point-adjusted F1 (every point of a labelled event counts
as detected once any point is) is reported only beside the others and named ``f1_pa``: it turns even a random
score into a good one (Kim et al., AAAI'22), see docs/detection.md.

VUS-PR follows the definition of TSB-AD (Paparrizos et al., VLDB'22; the ``RangeAUC_volume_opt`` routine of
TheDatumOrg/TSB-AD): for every buffer size ``b`` in 0..2*sliding_window each labelled range is widened by
``b // 2`` points on either side with soft labels ``sqrt(1 - d / b)``; range precision and recall (recall scaled
by the share of widened ranges hit) are taken at 250 score thresholds evenly spaced over the sorted scores; the
step-wise area under that PR curve is averaged over all buffer sizes. This implementation is vectorised over
thresholds; tests check it against a direct, point-by-point reading of the definition.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.metrics import average_precision_score, f1_score, precision_recall_curve, recall_score

from vigil.model import VigilInputError
from vigil_eval.datasets import WindowSet

VUS_THRESHOLDS = 250


def events(labels: np.ndarray) -> list[tuple[int, int]]:
    """Labelled anomaly ranges as inclusive (start, end) index pairs."""
    lab = (np.asarray(labels) > 0).astype(np.int8)
    edges = np.diff(np.r_[0, lab, 0])
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1) - 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _check(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lab = (np.asarray(labels).reshape(-1) > 0).astype(np.int64)
    sc = np.asarray(scores, dtype=np.float64).reshape(-1)
    if lab.shape != sc.shape:
        raise VigilInputError(f"evaluation: {sc.shape[0]} scores for {lab.shape[0]} labels")
    if not np.isfinite(sc).all():
        raise VigilInputError("evaluation: scores hold NaN or infinite values")
    return lab, sc


def choose_threshold(labels: np.ndarray, scores: np.ndarray) -> float:
    """The score threshold with the best F1 on validation data.

    Validation data without any anomaly gives the largest validation score: alarms only above anything seen
    on normal data.
    """
    lab, sc = _check(labels, scores)
    if lab.sum() == 0:
        return float(np.nextafter(sc.max(), np.inf))
    precision, recall, thresholds = precision_recall_curve(lab, sc)
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    return float(thresholds[int(np.argmax(f1[:-1]))])


def point_adjust(labels: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """Point adjustment (Xu et al. 2018): a labelled range counts as fully detected once any point is."""
    adjusted = np.asarray(predictions).astype(bool).copy()
    for start, end in events(labels):
        if adjusted[start:end + 1].any():
            adjusted[start:end + 1] = True
    return adjusted


def event_recall(labels: np.ndarray, predictions: np.ndarray) -> float:
    spans = events(labels)
    if not spans:
        return float("nan")
    pred = np.asarray(predictions).astype(bool)
    return float(np.mean([pred[s:e + 1].any() for s, e in spans]))


def detection_delay(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Mean number of points from an event's start to its first detected point, over detected events."""
    pred = np.asarray(predictions).astype(bool)
    delays = [int(np.argmax(pred[s:e + 1])) for s, e in events(labels) if pred[s:e + 1].any()]
    return float(np.mean(delays)) if delays else float("nan")


def _widen(labels: np.ndarray, spans: list[tuple[int, int]], buffer: int) -> np.ndarray:
    """Labels with soft ramps ``sqrt(1 - d / buffer)`` for ``d`` in 1..buffer//2 outside every range."""
    soft = labels.astype(np.float64).copy()
    n = len(soft)
    half = buffer // 2
    if half == 0:
        return soft
    ramp = np.sqrt(1.0 - np.arange(1, half + 1) / buffer)
    for start, end in spans:
        after = np.arange(end + 1, min(end + half + 1, n))
        soft[after] += ramp[: len(after)]
        before = np.arange(max(start - half, 0), start)
        soft[before] += ramp[: len(before)][::-1]
    return np.minimum(soft, 1.0)


def _merged_ranges(spans: list[tuple[int, int]], buffer: int, n: int) -> list[tuple[int, int]]:
    """The labelled ranges widened by ``buffer // 2`` on each side; ranges whose widenings touch merge."""
    half = buffer // 2
    merged: list[tuple[int, int]] = []
    start = max(spans[0][0] - half, 0)
    for (_, end), (next_start, _) in zip(spans[:-1], spans[1:], strict=True):
        if end + half < next_start - half:
            merged.append((start, end + half))
            start = next_start - half
    merged.append((start, min(spans[-1][1] + half, n - 1)))
    return merged


def vus_pr(labels: np.ndarray, scores: np.ndarray, sliding_window: int = 30,
           n_thresholds: int = VUS_THRESHOLDS) -> float:
    """Volume under the range-PR surface (TSB-AD's VUS-PR); NaN when there is no labelled anomaly."""
    lab, sc = _check(labels, scores)
    spans = events(lab)
    if not spans:
        return float("nan")
    n = len(sc)
    positives = float(lab.sum())
    ordered = -np.sort(-sc)
    cuts = ordered[np.linspace(0, n - 1, n_thresholds).astype(int)]
    pred = (sc[None, :] >= cuts[:, None]).astype(np.float64)
    n_pred = pred.sum(axis=1)
    hits = np.concatenate([np.zeros((n_thresholds, 1)), np.cumsum(pred, axis=1)], axis=1)
    inside = lab.astype(np.float64)
    aps = []
    for buffer in range(2 * sliding_window + 1):
        soft = _widen(lab, spans, buffer)
        margin = soft * (1.0 - inside)
        ranges = _merged_ranges(spans, buffer, n)
        starts = np.array([s for s, _ in ranges])
        ends = np.array([e for _, e in ranges])
        hit_ranges = ((hits[:, ends + 1] - hits[:, starts]) > 0).sum(axis=1)
        extra = pred @ margin
        tp = pred @ inside + extra
        p_new = (positives + positives + extra) / 2
        recall = np.minimum(tp / p_new, 1.0) * hit_ranges / len(ranges)
        precision = tp / n_pred
        widths = np.diff(np.r_[0.0, recall])
        aps.append(float(np.dot(widths, precision)))
    return float(np.mean(aps))


def score_report(labels: np.ndarray, scores: np.ndarray, threshold: float,
                 sliding_window: int = 30) -> dict[str, Any]:
    """Every metric of the eval table for one detector on one entity."""
    lab, sc = _check(labels, scores)
    pred = sc >= threshold
    has_events = bool(lab.any())
    return {
        "f1": float(f1_score(lab, pred, zero_division=0)),
        "precision": float(np.mean(lab[pred])) if pred.any() else 0.0,
        "recall": float(recall_score(lab, pred, zero_division=0)),
        "auc_pr": float(average_precision_score(lab, sc)) if has_events else float("nan"),
        "vus_pr": vus_pr(lab, sc, sliding_window=sliding_window),
        "event_recall": event_recall(lab, pred),
        "delay": detection_delay(lab, pred),
        "f1_pa": float(f1_score(lab, point_adjust(lab, pred), zero_division=0)),
        "threshold": float(threshold),
        "events": len(events(lab)),
        "points": int(len(lab)),
    }


def class_report(true: np.ndarray, predicted: np.ndarray, classes: list[str],
                 sample_weight: np.ndarray | None = None) -> dict[str, Any]:
    """Multi-class window classification: macro-F1 over the classes present, per-class recall and F1.

    ``sample_weight`` undoes a thinning of the test set (normal windows kept one in k weigh k), so the
    scores estimate those of the full set."""
    labels = list(range(len(classes)))
    per_f1 = f1_score(true, predicted, labels=labels, average=None, zero_division=0, sample_weight=sample_weight)
    per_recall = recall_score(true, predicted, labels=labels, average=None, zero_division=0,
                              sample_weight=sample_weight)
    present = [k for k in labels if (np.asarray(true) == k).any()]
    return {
        "macro_f1": float(np.mean(per_f1[present])),
        "per_class": {classes[k]: {"f1": float(per_f1[k]), "recall": float(per_recall[k]),
                                   "support": int((np.asarray(true) == k).sum())} for k in labels},
    }


# --------------------------------------------------------------------------- protocols

DETECTORS = ("tce", "lstm", "pca", "iforest", "kmeans", "random")


def make_detector(name: str, seed: int = 0, **tce_params: Any) -> Any:
    """A fresh detector by name; ``tce_params`` go to TCE only."""
    from vigil.detect.learned.baselines import BASELINES
    from vigil.detect.learned.tce import TCEDetector

    if name == "tce":
        return TCEDetector(seed=seed, **tce_params)
    if name not in BASELINES:
        raise VigilInputError(f"unknown detector {name!r}: expected one of {', '.join(DETECTORS)}")
    return BASELINES[name](seed=seed)


def fleet_split(dataset: Any, train_entities: list[str], test_entities: list[str], *, history: int,
                val_fraction: float = 0.3, normal_stride: int = 4) -> tuple[Any, Any, dict[str, Any]]:
    """Protocol (b): training windows from ``train_entities``, validation from the newest ``val_fraction``
    of their labelled data, one test window set per unseen entity.

    Training uses each training entity's unlabelled history (every ``normal_stride``-th window, as normal)
    and the older part of its labelled data; nothing of a test entity is seen except its own history as
    the input windows' past.
    """
    overlap = set(train_entities) & set(test_entities)
    if overlap:
        raise VigilInputError(f"entity {sorted(overlap)[0]!r} is both a training and a test entity")
    train, val = WindowSet(history), WindowSet(history)
    for series in dataset.select(train_entities):
        cut = int(len(series.test) * (1 - val_fraction))
        if series.train is not None:
            labels = series.train_labels if series.train_labels is not None else None
            train.add(series.train, labels, context=series.train_context,
                      rows=np.arange(0, len(series.train), normal_stride))
        train.add(series.test, series.test_labels, history=series.train, context=series.test_context,
                  rows=np.arange(cut))
        val.add(series.test, series.test_labels, history=series.train, context=series.test_context,
                rows=np.arange(cut, len(series.test)))
    tests = {s.entity: WindowSet(history).add(s.test, s.test_labels, history=s.train, context=s.test_context)
             for s in dataset.select(test_entities)}
    return train, val, tests


def calibration_split(dataset: Any, train_entities: list[str], *, history: int, val_fraction: float = 0.3,
                      normal_stride: int = 4) -> tuple[Any, Any, Any | None]:
    """TCE's side of protocol (b): the last training entity stands in for the unseen ones. Its unlabelled
    history still trains (as normal windows), its labelled data never do: they calibrate the novelty weight
    (``TCEDetector.calibrate``). Returns (train, validation, calibration); with a single training entity there
    is nothing to hold out and calibration is None."""
    held = train_entities[-1] if len(train_entities) >= 2 else None
    fit_on = train_entities[:-1] if held is not None else train_entities
    train, val, _ = fleet_split(dataset, fit_on, [], history=history, val_fraction=val_fraction,
                                normal_stride=normal_stride)
    if held is None:
        return train, val, None
    (series,) = dataset.select([held])
    if series.train is not None:
        train.add(series.train, series.train_labels, context=series.train_context,
                  rows=np.arange(0, len(series.train), normal_stride))
    calibration = WindowSet(history).add(series.test, series.test_labels, history=series.train,
                                         context=series.test_context)
    return train, val, calibration


def entity_split(series: Any, *, history: int, val_fraction: float = 0.3) -> tuple[Any, Any, Any]:
    """Protocol (a): fit on the entity's own history, choose the threshold on the oldest ``val_fraction`` of
    its labelled data, report on the rest."""
    cut = int(len(series.test) * val_fraction)
    train = WindowSet(history)
    if series.train is not None:
        train.add(series.train, series.train_labels, context=series.train_context)
    val = WindowSet(history).add(series.test, series.test_labels, history=series.train,
                                 context=series.test_context, rows=np.arange(cut))
    test = WindowSet(history).add(series.test, series.test_labels, history=series.train,
                                  context=series.test_context, rows=np.arange(cut, len(series.test)))
    return train, val, test


def run_detector(name: str, train: Any, val: Any, tests: dict[str, Any], *, seed: int = 0,
                 classes: list[str] | None = None, sliding_window: int = 30,
                 tce_params: dict[str, Any] | None = None,
                 tce_split: tuple[Any, Any, Any | None] | None = None) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Fit one detector, pick its threshold on ``val``, and score every test entity. ``tce_split``: TCE's
    (train, early-stopping validation, calibration) from ``calibration_split``; without it TCE trains on
    ``train`` and stops early on ``val``, uncalibrated."""
    import time

    detector = make_detector(name, seed, **(tce_params or {}))
    started = time.perf_counter()
    if name == "tce":
        fit_on, stop_on, calibration = tce_split if tce_split is not None else (train, val, None)
        detector.fit(fit_on, validation=stop_on, classes=classes, calibration=calibration)
    else:
        detector.fit(train)
    fit_s = time.perf_counter() - started
    rows, score_s = report_fitted(detector, name, val, tests, seed=seed, sliding_window=sliding_window)
    validation = float(detector.report_.best_validation) if name == "tce" else float("nan")
    return rows, {"fit_s": fit_s, "score_s": score_s, "validation": validation}


def report_fitted(detector: Any, name: str, val: Any, tests: dict[str, Any], *, seed: int = 0,
                  sliding_window: int = 30) -> tuple[list[dict[str, Any]], float]:
    """A fitted detector's rows: threshold = best F1 on ``val``, then every metric per test entity; and the
    seconds spent scoring."""
    import time

    threshold = choose_threshold(val.labels, detector.score(val))
    rows = []
    score_s = 0.0
    for entity, test in tests.items():
        started = time.perf_counter()
        scores = detector.score(test)
        score_s += time.perf_counter() - started
        rows.append({"detector": name, "entity": entity, "seed": seed,
                     **score_report(test.labels, scores, threshold, sliding_window=sliding_window)})
    return rows, score_s


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean of every metric per detector (NaN-aware: an entity without events has no event recall)."""
    metrics = ("f1", "auc_pr", "vus_pr", "event_recall", "delay", "f1_pa", "precision", "recall")
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(r["detector"] for r in rows):
        mine = [r for r in rows if r["detector"] == name]
        out[name] = {}
        for m in metrics:
            vals = np.array([r[m] for r in mine], dtype=np.float64)
            out[name][m] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
    return out
