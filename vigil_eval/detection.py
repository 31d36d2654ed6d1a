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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.metrics import average_precision_score, f1_score, precision_recall_curve, recall_score

from vigil.detect.learned.windows import WindowSet
from vigil.model import VigilInputError
from vigil_eval.datasets import Dataset, EntitySeries

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


def per_machine_threshold(machines: Sequence[tuple[np.ndarray, np.ndarray]], n_cuts: int = 400) -> float:
    """The threshold with the best mean F1 over machines, each given as ``(labels, scores)``; candidates are
    ``n_cuts`` quantiles of the pooled scores. A machine without anomalies has F1 0 at any threshold (as in the
    reported mean); none with anomalies gives the largest score, as ``choose_threshold`` does."""
    pooled = np.concatenate([np.asarray(sc, dtype=np.float64) for _, sc in machines])
    cuts = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, n_cuts)))
    total = np.zeros(len(cuts))
    any_positive = False
    for labels, scores in machines:
        lab, sc = _check(labels, scores)
        positives = int(lab.sum())
        if not positives:
            continue
        any_positive = True
        predicted = len(sc) - np.searchsorted(np.sort(sc), cuts, side="left")
        hits = positives - np.searchsorted(np.sort(sc[lab > 0]), cuts, side="left")
        total += 2 * hits / np.maximum(predicted + positives, 1)
    if not any_positive:
        return float(np.nextafter(pooled.max(), np.inf))
    return float(cuts[int(np.argmax(total))])


def mean_machine_f1(machines: Sequence[tuple[np.ndarray, np.ndarray]], threshold: float) -> float:
    """Mean over machines of the point-wise F1 at ``threshold`` (0 where a machine has no anomaly)."""
    f1 = []
    for labels, scores in machines:
        lab, sc = _check(labels, scores)
        f1.append(float(f1_score(lab, sc >= threshold, zero_division=0)))
    return float(np.mean(f1))


def rule_threshold(rule: str, machines: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """The threshold ``rule`` (``THRESHOLD_RULES``) sets on ``machines``' ``(labels, scores)``."""
    if rule == "pooled":
        return choose_threshold(np.concatenate([lab for lab, _ in machines]),
                                np.concatenate([sc for _, sc in machines]))
    if rule == "per-machine":
        return per_machine_threshold(machines)
    raise VigilInputError(f"unknown threshold rule {rule!r}")


def choose_threshold_rule(groups: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]],
                          rules: Sequence[str] = ("pooled", "per-machine")) -> tuple[str, float, dict[str, float]]:
    """A threshold rule chosen by cross-fitting over groups of held-out machines: each rule sets its threshold
    on the other groups and is scored by the mean per-machine F1 on the group left out; the best mean wins
    (ties: the first rule) and sets the threshold on every machine. Returns the rule, its threshold and each
    rule's cross-fitted F1."""
    evidence: dict[str, float] = {}
    for rule in rules:
        scores = []
        for g, held in enumerate(groups):
            others = [m for h, group in enumerate(groups) if h != g for m in group]
            if held and others:
                scores.append(mean_machine_f1(held, rule_threshold(rule, others)))
        evidence[rule] = float(np.mean(scores)) if scores else float("nan")
    best = max(rules, key=lambda r: (np.nan_to_num(evidence[r], nan=-1.0), -rules.index(r)))
    return best, rule_threshold(best, [m for group in groups for m in group]), evidence


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

# TCE on server metrics (ASD, SMD, users' CSV), fixed before any fold was scored, never tuned: its size, loss
# (dynamic weights), one model (no ensemble), window features as its context, a normal-window memory at
# KMeansAD's own setting (20 centroids of the newest 10 rows). The benchmark and `vigil detect train` use it.
# A learned-space memory of 20 centroids of the classifier's hidden layer (the embedding part of the mix).
SERVER_TCE: dict[str, Any] = {"recent": 24, "scales": (12, 24), "hidden": 32, "epochs": 5, "steps_per_epoch": 40,
                              "patience": 2, "prototypes": 16, "window_context": True, "memory": 20,
                              "memory_rows": 10, "embedding": 20, "own_memory": 20}
DETECTORS = ("tce", "lstm", "pca", "iforest", "kmeans", "knn", "random")
# Fed the same labels as TCE; they need labelled anomalies in their training data, like TCE.
SUPERVISED_BASELINES = ("gbm", "lstm_clf")
# Fitted on each scored machine's own unlabelled history alone (``per_machine``), never on the fleet: KMeansAD
# as TCE's own-history part is fitted. Judged by the nested protocol only (a fleet split has no per-machine fit).
PER_MACHINE_BASELINES = ("kmeans-own",)


def make_detector(name: str, seed: int = 0, **params: Any) -> Any:
    """A fresh detector by name with its constructor ``params``."""
    from vigil.detect.learned.baselines import BASELINES
    from vigil.detect.learned.tce import TCEDetector

    if name == "tce":
        return TCEDetector(seed=seed, **params)
    if name not in BASELINES:
        raise VigilInputError(f"unknown detector {name!r}: expected one of "
                              f"{', '.join((*DETECTORS, *SUPERVISED_BASELINES, *PER_MACHINE_BASELINES))}")
    return BASELINES[name](seed=seed, **params)


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
                 tce_params: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Fit one detector, pick its threshold on ``val``, and score every test entity (TCE stops early on
    ``val`` and scores ``1 - p(normal)``)."""
    import time

    detector = make_detector(name, seed, **((tce_params or {}) if name == "tce" else {}))
    started = time.perf_counter()
    if name == "tce":
        detector.fit(train, validation=val, classes=classes)
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

    threshold = choose_threshold(val.labels, detector.decision_function(val))
    rows = []
    score_s = 0.0
    for entity, test in tests.items():
        started = time.perf_counter()
        scores = detector.decision_function(test)
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


# --------------------------------------------------------------------------- nested leave-machines-out

# Input scalings: the fleet's values as they come; each machine standardised by the mean and spread of its own
# history; or by its median and interquartile range (robust to the spikes a history holds).
NORMALISATIONS = ("fleet", "machine", "robust")
IQR_TO_SD = 1.349  # the interquartile range of a normal distribution, in standard deviations


def standardise_per_machine(dataset: Any, *, robust: bool = False) -> Any:
    """Each machine's metrics standardised by its own unlabelled history (its train part): what a new
    machine offers before anyone labels it. ``robust``: centre on the median and divide by the interquartile
    range (in standard-deviation units), falling back to the standard deviation where the range is zero.
    A metric constant in the history keeps unit scale."""
    out: dict[str, EntitySeries] = {}
    for name, series in dataset.entities.items():
        if series.train is None:
            raise VigilInputError(f"{name}: per-machine standardisation needs the machine's history (train part)")
        std = series.train.std(axis=0)
        if robust:
            q25, centre, q75 = np.percentile(series.train, [25, 50, 75], axis=0)
            spread = np.where((q75 - q25) > 1e-6, (q75 - q25) / IQR_TO_SD, std)
        else:
            centre, spread = series.train.mean(axis=0), std
        spread = np.where(spread < 1e-6, 1.0, spread)
        out[name] = EntitySeries(entity=name, test=((series.test - centre) / spread).astype(np.float32),
                                 test_labels=series.test_labels,
                                 train=((series.train - centre) / spread).astype(np.float32),
                                 train_labels=series.train_labels, imputed=series.imputed,
                                 train_context=series.train_context, test_context=series.test_context)
    return Dataset(name=dataset.name, features=dataset.features, classes=dataset.classes, entities=out)


def scaled_inputs(dataset: Any) -> dict[str, Any]:
    """The data set under every input scaling of ``NORMALISATIONS``."""
    return {"fleet": dataset, "machine": standardise_per_machine(dataset),
            "robust": standardise_per_machine(dataset, robust=True)}


def machine_groups(entities: list[str], k: int, seed: int) -> list[list[str]]:
    """``entities`` shuffled by ``seed`` and dealt into ``k`` groups of near-equal size (each group is one
    fold's held-out machines)."""
    if not 2 <= k <= len(entities):
        raise VigilInputError(f"cannot make {k} folds of {len(entities)} machines")
    order = np.random.default_rng(seed).permutation(len(entities))
    return [sorted(entities[i] for i in part) for part in np.array_split(order, k)]


def training_windows(dataset: Any, entities: list[str], *, history: int, normal_stride: int = 4,
                     max_windows: int | None = None, seed: int = 0) -> Any:
    """Training windows of ``entities``: every ``normal_stride``-th window of the unlabelled history (as
    normal) and every window of the labelled part. Above ``max_windows``, normal windows are thinned at
    random (every anomalous one kept), so a large fleet costs no more than a small one."""
    parts = []
    for series in dataset.select(entities):
        if series.train is not None:
            labels = (series.train_labels if series.train_labels is not None
                      else np.zeros(len(series.train), dtype=np.int64))
            parts.append((series.train, labels, None, np.arange(0, len(series.train), normal_stride)))
        parts.append((series.test, series.test_labels, series.train, np.arange(len(series.test))))
    total = sum(len(rows) for *_, rows in parts)
    anomalous = sum(int((labels[rows] > 0).sum()) for _, labels, _, rows in parts)
    keep = 1.0
    if max_windows is not None and total > max_windows:
        keep = max(max_windows - anomalous, 0) / max(total - anomalous, 1)
    rng = np.random.default_rng(seed)
    train = WindowSet(history)
    for values, labels, past, rows in parts:
        if keep < 1.0:
            rows = rows[(labels[rows] > 0) | (rng.random(len(rows)) < keep)]
        train.add(values, labels, history=past, rows=rows)
    return train


def labelled_windows(series: Any, *, history: int, stride: int = 1) -> Any:
    """Windows over a machine's labelled part (every ``stride``-th), its history as their past."""
    return WindowSet(history).add(series.test, series.test_labels, history=series.train,
                                  rows=np.arange(0, len(series.test), stride))


def history_windows(series: Any, *, history: int, count: int = 720) -> Any:
    """``count`` windows spread over a machine's unlabelled history: the reference its scores are read
    against (``relative_scores``)."""
    n = len(series.train)
    rows = np.unique(np.linspace(min(history, n - 1), n - 1, min(count, n)).astype(np.int64))
    return WindowSet(history).add(series.train, rows=rows)


def relative_scores(scores: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Scores in units of the machine's own history scores: ``(s - median) / IQR``. Label-free, fitted per
    machine, so one threshold means the same on every machine and for every model (AUC-PR and VUS-PR are
    unchanged: the map is increasing)."""
    ref = np.asarray(reference, dtype=np.float64)
    q25, median, q75 = np.percentile(ref, [25, 50, 75])
    spread = q75 - q25
    if spread <= 1e-12:
        spread = max(float(ref.std()), 1e-12)
    return (np.asarray(scores, dtype=np.float64) - median) / spread


@dataclass
class Candidate:
    """One configuration that needs its own training: a detector, its parameters and the input scaling."""

    label: str
    detector: str
    params: dict[str, Any] = field(default_factory=dict)
    normalise: str = "fleet"


# Shares of synthetic anomalies TCE trains on beside the labelled ones (vigil.detect.learned.augment); the
# inner folds choose.
TCE_AUGMENT = (0.0, 0.05)


def candidates_for(name: str, params: dict[str, Any] | None = None) -> list[Candidate]:
    """The inner-fold grid of one detector: every input scaling, the detector's own parameters fixed; TCE
    (unless ``params`` fix ``augment``) also trains with each share of synthetic anomalies of ``TCE_AUGMENT``."""
    given = dict(params or {})
    shares: tuple[float, ...] = (0.0,)
    if name == "tce" and "augment" not in given:
        shares = TCE_AUGMENT
    return [Candidate(f"{name}{f'+aug{share:g}' if share else ''}[{norm}]", name,
                      {**given, "augment": share} if share else dict(given), norm)
            for share in shares for norm in NORMALISATIONS]


# Mixes with the own-history part (weights of supervised, novelty, memory, embedding, own); the same part sets
# are offered to ``max`` (COMBINED_GRID), never to ``agree`` (its reference is the newer half of the history).
OWN_MIXES: dict[str, tuple[float, ...]] = {
    "own": (0.0, 0.0, 0.0, 0.0, 1.0), "sup+own": (1.0, 0.0, 0.0, 0.0, 1.0), "mem+own": (0.0, 0.0, 1.0, 0.0, 1.0),
    "sup+mem+own": (1.0, 0.0, 1.0, 0.0, 1.0), "sup+emb+own": (1.0, 0.0, 0.0, 1.0, 1.0),
}
# TCE's score mixes (weights of the supervised, novelty, memory and embedding parts, each read against the
# machine's own history and averaged as ranks): with the learned model (its classifier or its embedding), and
# without the classifier (``nov``, ``mem``, ``nov+mem``, ...), for machines where what it learnt on other
# machines does not carry over. The inner folds choose one.
MIX_GRID: dict[str, tuple[float, ...]] = {
    "sup": (1.0, 0.0, 0.0, 0.0), "sup+nov": (1.0, 1.0, 0.0, 0.0), "sup+mem": (1.0, 0.0, 1.0, 0.0),
    "sup+nov+mem": (1.0, 1.0, 1.0, 0.0), "2sup+nov+mem": (2.0, 1.0, 1.0, 0.0),
    "sup+2nov+2mem": (1.0, 2.0, 2.0, 0.0), "sup+nov+2mem": (1.0, 1.0, 2.0, 0.0),
    "sup+2nov+4mem": (1.0, 2.0, 4.0, 0.0),
    "emb": (0.0, 0.0, 0.0, 1.0), "sup+emb": (1.0, 0.0, 0.0, 1.0), "emb+mem": (0.0, 0.0, 1.0, 1.0),
    "sup+emb+mem": (1.0, 0.0, 1.0, 1.0), "sup+nov+mem+emb": (1.0, 1.0, 1.0, 1.0),
    "sup+nov+2mem+2emb": (1.0, 1.0, 2.0, 2.0), "sup+2mem+2emb": (1.0, 0.0, 2.0, 2.0),
    "nov": (0.0, 1.0, 0.0, 0.0), "mem": (0.0, 0.0, 1.0, 0.0), "nov+mem": (0.0, 1.0, 1.0, 0.0),
    "nov+2mem": (0.0, 1.0, 2.0, 0.0), "nov+mem+emb": (0.0, 1.0, 1.0, 1.0),
    # The own-history memory (``own``; pre-registered 2026-12-07, docs/detection.md): alone, beside the
    # classifier, beside the fleet memory, and with both.
    **OWN_MIXES,
}
# The label-free combinations beside the rank mean (vigil.detect.learned.tce.combine_parts), over sets of
# parts: ``max`` (the largest part in units of its history's tail) over every set of two or more parts;
# ``agree`` (each part weighed by its agreement with the others on the machine's history) over every set of
# three or more (with two parts agreement weighs both alike: the rank mean).
PART_SETS: dict[str, tuple[float, ...]] = {
    "+".join(short for short, w in zip(("sup", "nov", "mem", "emb"), mix, strict=True) if w): mix
    for mix in [tuple(float(b >> k & 1) for k in range(4)) for b in range(1, 16)]
}
COMBINED_GRID: dict[str, tuple[str, tuple[float, ...]]] = {
    f"{rule}:{label}": (rule, mix) for rule, least in (("max", 2), ("agree", 3))
    for label, mix in PART_SETS.items() if sum(mix) >= least
} | {f"max:{label}": ("max", mix) for label, mix in OWN_MIXES.items() if sum(mix) >= 2}
# Trailing means of every detector's score over this many rows (1 = none); the inner folds choose one.
SMOOTHING_ROWS = (1, 3, 6, 12, 24, 48)
# How the alarm threshold is set from the inner held-out machines' relative scores: the best F1 on their
# pooled scores, or the threshold with the best mean of their per-machine F1 (the reported figure is a mean
# over machines, and a pooled F1 lets the machines with most anomalies set it). The inner folds choose.
THRESHOLD_RULES = ("pooled", "per-machine")
# How the inner folds pick the (candidate, variant) pair (docs/detection.md, "Pre-registered selection rule
# (2026-12-06)"): ``one-se`` = the simplest pair (``selection_complexity``) whose mean inner AUC-PR is within
# one standard error (over the inner held-out machines) of the best mean; ``best`` = the best mean (the rule of
# the runs before 2026-12-06); ``one-se-scaling-free`` = ``one-se`` with the input scaling dropped from the
# complexity order, so equally simple pairs of different scalings go to the higher mean (docs/detection.md,
# "Pre-registered change: input scaling is not complexity (2026-12-07)").
SELECTION_RULES = ("one-se", "best", "one-se-scaling-free")
# How the development machines of an outer fold are held out in the inner folds: ``groups`` = dealt into
# ``inner`` groups, each held out in turn (the reported protocol); ``lomo`` = every development machine held out
# once, alone, every candidate fitted on the others (docs/detection.md, "Pre-registered next change:
# leave-one-machine-out inner folds"). Either way the threshold rule is cross-fitted over the held-out folds,
# so under ``lomo`` each machine is scored with the threshold chosen on the others' scores.
INNER_SCHEMES = ("groups", "lomo")
COMBINATION_ORDER = {"rank-equal": 1, "rank-weighted": 2, "max": 3, "agree": 4}


# The position of the input scaling in ``selection_complexity``'s key (its last entry).
SCALING_KEY = 4


def selection_complexity(candidate: Candidate, variant: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """The pre-registered complexity of a (candidate, variant) pair, compared lexicographically (smaller is
    simpler): the number of score parts (TCE's parts with a non-zero weight; a baseline's own score is one),
    the combination (one part: none, 0; rank mean with equal weights 1, with unequal weights 2; ``max`` 3;
    ``agree`` 4), synthetic anomalies (none 0, some 1), the smoothing rows, the input scaling (fleet 0, per
    machine 1, robust 2)."""
    mix = variant.get("mix")
    weights = [float(w) for w in mix if w] if mix is not None else [1.0]
    combination = 0
    if len(weights) > 1:
        rule = variant.get("combine") or "rank"
        if rule == "rank":
            rule = "rank-equal" if len(set(weights)) == 1 else "rank-weighted"
        if rule not in COMBINATION_ORDER:
            raise VigilInputError(f"unknown combination rule {rule!r}")
        combination = COMBINATION_ORDER[rule]
    augment = 1 if float(candidate.params.get("augment", 0.0) or 0.0) > 0 else 0
    return (len(weights), combination, augment, int(variant.get("smooth", 1)),
            NORMALISATIONS.index(candidate.normalise))


@dataclass
class Selection:
    """The pair a selection rule picked and its evidence: the best mean's pair, its mean and standard error
    over the held-out machines, and how many pairs were eligible (within one standard error)."""

    key: tuple[int, str]
    best: tuple[int, str]
    best_mean: float
    se: float
    eligible: int


def select_pair(per_machine: dict[tuple[int, str], list[float]],
                complexity: dict[tuple[int, str], tuple[int, ...]], rule: str = "one-se") -> Selection:
    """Pick a (candidate, variant) pair from its per-machine inner AUC-PRs (``SELECTION_RULES``).

    ``best``: the highest mean (ties: the pair listed first). ``one-se``: among the pairs whose mean is at least
    the best mean minus the standard error of the best pair's mean (``sd(ddof=1) / sqrt(n)`` over its held-out
    machines; 0 with fewer than 2), the smallest ``complexity``; ties: the higher mean, then the pair listed
    first. ``one-se-scaling-free``: as ``one-se``, the complexity compared without its input scaling
    (``SCALING_KEY``), so among pairs equal in everything else the higher mean wins whatever its scaling."""
    if rule not in SELECTION_RULES:
        raise VigilInputError(f"unknown selection rule {rule!r}: expected one of {', '.join(SELECTION_RULES)}")
    if not per_machine:
        raise VigilInputError("no inner scores to select from")
    order = {key: i for i, key in enumerate(per_machine)}
    means = {key: float(np.mean(values)) for key, values in per_machine.items()}
    best = max(per_machine, key=lambda key: (means[key], -order[key]))
    values = np.asarray(per_machine[best], dtype=np.float64)
    se = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0
    eligible = [key for key in per_machine if means[key] >= means[best] - se]
    if rule == "best":
        return Selection(key=best, best=best, best_mean=means[best], se=se, eligible=len(eligible))
    counted = {k: complexity[k] if rule == "one-se" else complexity[k][:SCALING_KEY] for k in eligible}
    key = min(eligible, key=lambda k: (counted[k], -means[k], order[k]))
    return Selection(key=key, best=best, best_mean=means[best], se=se, eligible=len(eligible))


def variant_grid(detector: Any) -> dict[str, dict[str, Any]]:
    """The cheap variants of a fitted detector (no retraining): label -> ``{"mix", "smooth", "combine"}``.
    TCE: every rank mix of ``MIX_GRID`` and every combination of ``COMBINED_GRID`` whose parts the model has,
    times every smoothing; the others: every smoothing of their own score (``mix`` and ``combine`` None)."""
    is_tce = getattr(detector, "name", "") == "tce"
    mixes: dict[str, Any] = {"": (None, None)}
    if is_tce:
        from vigil.detect.learned.tce import COMPONENTS, full_mix

        have = set(detector.score_components_available())
        offered = {**{label: ("rank", mix) for label, mix in MIX_GRID.items()}, **COMBINED_GRID}
        mixes = {label: (rule, mix) for label, (rule, mix) in offered.items()
                 if all(name in have for name, w in zip(COMPONENTS, full_mix(mix), strict=True) if w)}
    return {" ".join(p for p in (label, "" if rows == 1 else f"smooth={rows}") if p):
            {"mix": mix, "smooth": rows, "combine": rule}
            for label, (rule, mix) in mixes.items() for rows in SMOOTHING_ROWS}


def variant_scores(detector: Any, windows: Any, reference: Any, *, stride: int = 1,
                   parts_out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every variant of ``variant_grid`` scored on ``windows`` of one machine (every ``stride``-th row)
    relative to ``reference`` (windows of the same machine's unlabelled history). TCE: its parts read against
    the history and combined (``combine_parts``, as ``relative_score`` does); the rest: the detector's own score
    through ``relative_scores`` (a ``per_machine`` detector fitted on the older part of ``reference`` and read
    against the newer rest, ``score_own_history``). Then the trailing mean over the variant's rows (in windows:
    rows / ``stride``, at least 1). ``parts_out`` receives TCE's raw parts on ``windows``."""
    from vigil.detect.learned.tce import combine_parts, trailing_mean

    grid = variant_grid(detector)
    if getattr(detector, "name", "") == "tce":
        readings, parts = detector.read_parts(windows, reference)
        if parts_out is not None:
            parts_out.update(parts)
    elif getattr(detector, "per_machine", False):
        plain = relative_scores(*detector.score_own_history(windows, reference))
    else:
        scores = np.asarray(detector.decision_function(windows), dtype=np.float64)
        plain = relative_scores(scores, np.asarray(detector.decision_function(reference), dtype=np.float64))
    combined: dict[tuple[str, tuple[float, ...]], np.ndarray] = {}
    out = {}
    for label, variant in grid.items():
        if variant["mix"] is None:
            mixed = plain
        else:
            key = (variant["combine"], tuple(variant["mix"]))
            if key not in combined:
                combined[key] = combine_parts(readings, variant["mix"], variant["combine"])
            mixed = combined[key]
        out[label] = trailing_mean(mixed, max(1, round(variant["smooth"] / stride)))
    return out


def inner_folds(development: list[str], inner: int, seed: int, scheme: str = "groups") -> list[list[str]]:
    """The inner folds' held-out machines of one outer fold's ``development`` machines (``INNER_SCHEMES``):
    ``groups``, dealt into ``inner`` groups by ``seed`` (``machine_groups``); ``lomo``, one fold per machine,
    in the order given (``inner`` and ``seed`` unused)."""
    if scheme == "groups":
        return machine_groups(development, inner, seed)
    if scheme == "lomo":
        if len(development) < 2:
            raise VigilInputError(f"cannot leave one machine out of {len(development)} machine(s)")
        return [[name] for name in development]
    raise VigilInputError(f"unknown inner scheme {scheme!r}: expected one of {', '.join(INNER_SCHEMES)}")


def fit_candidate(candidate: Any, dataset: Any, fit_on: list[str], *, history: int, seed: int,
                  validation: Any | None = None, epochs: int | None = None,
                  normal_stride: int = 4, max_windows: int | None = None) -> Any:
    """A fresh detector of ``candidate`` fitted on the machines ``fit_on``; TCE stops early on
    ``validation`` (windows of other development machines) or trains ``epochs`` epochs. A ``per_machine``
    detector is returned unfitted: it reads no machine of ``fit_on``, only each scored machine's own history
    (``variant_scores``)."""
    params = dict(candidate.params)
    if candidate.detector == "tce" and epochs is not None:
        params["epochs"] = epochs
    detector = make_detector(candidate.detector, seed, **params)
    if getattr(detector, "per_machine", False):
        return detector
    train = training_windows(dataset, fit_on, history=history, normal_stride=normal_stride,
                             max_windows=max_windows, seed=seed)
    if candidate.detector == "tce":
        detector.fit(train, validation=validation, classes=dataset.classes, features=dataset.features)
    else:
        detector.fit(train)
    return detector


@dataclass
class InnerChoice:
    """What the inner folds of a set of development machines chose: the candidate (index into the candidates),
    its variant (``variant_grid``), the threshold on relative scores, TCE's epoch count, and the evidence."""

    candidate: int
    variant: str
    threshold: float
    epochs: int | None
    inner_auc_pr: float
    inner_folds: list[list[str]]
    inner_grid: dict[str, float]
    threshold_rule: str = "pooled"
    rule_f1: dict[str, float] = field(default_factory=dict)
    selection: str = "one-se"
    inner_se: float = 0.0
    best_pair: str = ""
    best_inner_auc_pr: float = float("nan")
    eligible: int = 1


def choose_on_inner_folds(data: dict[str, Any], candidates: list[Candidate], development: list[str], *,
                          inner: int, history: int, seed: int, inner_stride: int = 1, normal_stride: int = 4,
                          max_windows: int | None = None, log: Any = None,
                          selection: str = "one-se", inner_scheme: str = "groups") -> InnerChoice:
    """Every choice for one detector made on ``development`` machines alone. They are dealt into ``inner``
    groups (``inner_scheme="groups"``) or each held out alone (``"lomo"``, ``inner_folds``); each candidate is
    fitted on all but one inner fold and scored on that fold (every ``inner_stride``-th window), its scores read
    relative to each held-out machine's own history. The candidate and variant are picked from their AUC-PR on
    each held-out machine by ``selection`` (``select_pair``: ``one-se``, the simplest pair within one standard
    error of the best mean, or ``best``, the best mean); the threshold rule (``THRESHOLD_RULES``) is chosen by
    cross-fitting between the inner folds (``choose_threshold_rule``; under ``lomo`` each machine scored with
    the threshold chosen on the others) and sets the threshold on all held-out machines' relative scores; TCE's
    epoch count is the median of its early-stopping epochs. ``data``: the data set under each input scaling
    (``scaled_inputs``)."""
    if selection not in SELECTION_RULES:
        raise VigilInputError(f"unknown selection rule {selection!r}: "
                              f"expected one of {', '.join(SELECTION_RULES)}")
    inner_groups = inner_folds(development, inner, seed, inner_scheme)
    inner_ap: dict[tuple[int, str], list[float]] = {}
    complexity: dict[tuple[int, str], tuple[int, ...]] = {}
    pooled: dict[tuple[int, str], list[tuple[int, np.ndarray, np.ndarray]]] = {}
    epochs_seen: dict[int, list[int]] = {}
    for g, held in enumerate(inner_groups):
        fit_on = [n for n in development if n not in held]
        for c, candidate in enumerate(candidates):
            held_series = data[candidate.normalise].select(held)
            validation = None
            if candidate.detector == "tce":
                validation = WindowSet(history)
                for s in held_series:
                    validation.add(s.test, s.test_labels, history=s.train,
                                   rows=np.arange(0, len(s.test), inner_stride))
            if log is not None:
                log(f"inner {held}: {candidate.label}")
            detector = fit_candidate(candidate, data[candidate.normalise], fit_on, history=history, seed=seed,
                                     validation=validation, normal_stride=normal_stride, max_windows=max_windows)
            if candidate.detector == "tce":
                epochs_seen.setdefault(c, []).append(max(1, int(detector.report_.best_epoch)))
            for variant, spec in variant_grid(detector).items():
                complexity.setdefault((c, variant), selection_complexity(candidate, spec))
            for s in held_series:
                labelled = labelled_windows(s, history=history, stride=inner_stride)
                reference = history_windows(s, history=history)
                for variant, relative in variant_scores(detector, labelled, reference, stride=inner_stride).items():
                    if labelled.labels.any():
                        inner_ap.setdefault((c, variant), []).append(
                            float(average_precision_score(labelled.labels > 0, relative)))
                    pooled.setdefault((c, variant), []).append((g, labelled.labels, relative))
    if not inner_ap:
        raise VigilInputError("no held-out development machine holds a labelled anomaly: nothing to choose on")
    picked = select_pair(inner_ap, complexity, selection)
    best_c, best_variant = picked.key
    held_out = pooled[(best_c, best_variant)]
    rule, threshold, rule_f1 = choose_threshold_rule(
        [[(lab, sc) for h, lab, sc in held_out if h == g] for g in range(len(inner_groups))], THRESHOLD_RULES)
    return InnerChoice(
        candidate=best_c, variant=best_variant, threshold=threshold, threshold_rule=rule, rule_f1=rule_f1,
        epochs=int(np.median(epochs_seen[best_c])) if best_c in epochs_seen else None,
        inner_auc_pr=float(np.mean(inner_ap[(best_c, best_variant)])), inner_folds=inner_groups,
        selection=selection, inner_se=picked.se, eligible=picked.eligible, best_inner_auc_pr=picked.best_mean,
        best_pair=f"{candidates[picked.best[0]].label} {picked.best[1]}".strip(),
        inner_grid={f"{candidates[c].label} {v}".strip(): float(np.mean(ap)) for (c, v), ap in inner_ap.items()})


def fit_chosen(data: dict[str, Any], candidates: list[Candidate], choice: InnerChoice, development: list[str], *,
               history: int, seed: int, normal_stride: int = 4, max_windows: int | None = None) -> Any:
    """The inner folds' winner refitted on every development machine (TCE for the chosen epoch count), its
    chosen variant and threshold set: TCE's ``mix``, ``smooth``, ``combine`` and ``threshold_`` (on
    ``relative_score``), and ``choice_`` recording the input scaling and the inner-fold evidence."""
    winner = candidates[choice.candidate]
    detector = fit_candidate(winner, data[winner.normalise], development, history=history, seed=seed,
                             epochs=choice.epochs, normal_stride=normal_stride, max_windows=max_windows)
    variant = variant_grid(detector)[choice.variant]
    if variant["mix"] is not None:
        from vigil.detect.learned.tce import full_mix

        detector.mix = full_mix(variant["mix"])
        detector.smooth = int(variant["smooth"])
        detector.combine = variant["combine"]
    detector.threshold_ = choice.threshold
    detector.choice_ = {"scaling": winner.normalise, "variant": choice.variant, "epochs": choice.epochs,
                        "threshold": choice.threshold, "threshold_rule": choice.threshold_rule,
                        "inner_auc_pr": choice.inner_auc_pr, "selection": choice.selection,
                        "inner_se": choice.inner_se, "best_pair": choice.best_pair,
                        "inner_folds": choice.inner_folds, "development": list(development)}
    return detector


@dataclass
class NestedResult:
    rows: list[dict[str, Any]]
    choices: list[dict[str, Any]]


def nested_leave_machines_out(dataset: Any, candidates: list[Candidate], *, outer: int, inner: int,
                              history: int, seed: int = 0, inner_stride: int = 1, normal_stride: int = 4,
                              max_windows: int | None = None, sliding_window: int = 30,
                              log: Any = None, on_fold: Any = None,
                              folds: Sequence[int] | None = None, selection: str = "one-se",
                              inner_scheme: str = "groups") -> NestedResult:
    """Nested leave-machines-out for one detector's ``candidates``.

    Outer loop: the machines are dealt into ``outer`` groups; each group in turn is the test fold, never seen
    before it is scored once. Inner loop, on the other (development) machines only (``inner`` groups, or each
    machine held out alone with ``inner_scheme="lomo"``): ``choose_on_inner_folds``
    (by the ``selection`` rule, ``SELECTION_RULES``) picks the input scaling, the variant (TCE's score mix,
    every detector's smoothing), the threshold and TCE's epoch count. The winner is refitted on every
    development machine (``fit_chosen``), and the test machines are scored once with that threshold. Seeds:
    ``seed + outer fold``. ``on_fold(result)`` after each outer fold sees the folds done so far; ``folds`` runs
    only those outer folds (the deal of machines into folds is the same, so separate runs of different folds
    add up to one run).
    """
    data = scaled_inputs(dataset)
    names = sorted(dataset.entities)
    rows: list[dict[str, Any]] = []
    choices: list[dict[str, Any]] = []
    for o, test_group in enumerate(machine_groups(names, outer, seed)):
        if folds is not None and o not in folds:
            continue
        fold_seed = seed + o
        development = [n for n in names if n not in test_group]
        choice = choose_on_inner_folds(
            data, candidates, development, inner=inner, history=history, seed=fold_seed, inner_stride=inner_stride,
            normal_stride=normal_stride, max_windows=max_windows, selection=selection, inner_scheme=inner_scheme,
            log=None if log is None else (lambda msg, o=o: log(f"outer {o} {msg}")))
        winner = candidates[choice.candidate]
        choices.append({"outer_fold": o, "test": test_group, "inner_folds": choice.inner_folds,
                        "candidate": winner.label, "variant": choice.variant, "inner_auc_pr": choice.inner_auc_pr,
                        "threshold": choice.threshold, "threshold_rule": choice.threshold_rule,
                        "rule_f1": choice.rule_f1, "epochs": choice.epochs, "seed": fold_seed,
                        "selection": choice.selection, "inner_scheme": inner_scheme, "inner_se": choice.inner_se,
                        "best_pair": choice.best_pair, "best_inner_auc_pr": choice.best_inner_auc_pr,
                        "eligible": choice.eligible, "inner_grid": choice.inner_grid})
        if log is not None:
            log(f"outer {o}: chose {winner.label} {choice.variant} (inner AUC-PR {choice.inner_auc_pr:.3f}; "
                f"{choice.selection}: best {choice.best_pair} {choice.best_inner_auc_pr:.3f} ± {choice.inner_se:.3f}, "
                f"{choice.eligible} eligible); refit on {len(development)} machines")
        detector = fit_chosen(data, candidates, choice, development, history=history, seed=fold_seed,
                              normal_stride=normal_stride, max_windows=max_windows)
        for s in data[winner.normalise].select(test_group):
            labelled = labelled_windows(s, history=history)
            parts: dict[str, np.ndarray] = {}
            scores = variant_scores(detector, labelled, history_windows(s, history=history),
                                    parts_out=parts)[choice.variant]
            # Diagnosis only, written after every choice of the fold was made: how each of TCE's parts alone
            # ranks this test machine's anomalies (AUC-PR of the raw part).
            diagnosis = ({f"part_auc_pr_{name}": float(average_precision_score(labelled.labels > 0, part))
                          for name, part in parts.items()} if labelled.labels.any() else {})
            rows.append({"detector": candidates[0].detector, "entity": s.entity, "outer_fold": o,
                         "seed": fold_seed, "choice": f"{winner.label} {choice.variant}".strip(), **diagnosis,
                         **score_report(labelled.labels, scores, threshold=choice.threshold,
                                        sliding_window=sliding_window)})
        if on_fold is not None:
            on_fold(NestedResult(rows=list(rows), choices=list(choices)))
    return NestedResult(rows=rows, choices=choices)


def fold_spread(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per detector and metric: the mean over outer folds of each fold's mean over its test machines, and the
    standard deviation of those fold means (the spread the README quotes)."""
    metrics = ("f1", "auc_pr", "vus_pr", "f1_pa", "event_recall", "precision", "recall")
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(r["detector"] for r in rows):
        mine = [r for r in rows if r["detector"] == name]
        folds = sorted({r["outer_fold"] for r in mine})
        out[name] = {"folds": float(len(folds)), "machines": float(len(mine))}
        for m in metrics:
            per_fold = [np.nanmean([r[m] for r in mine if r["outer_fold"] == f]) for f in folds]
            out[name][m] = float(np.mean(per_fold))
            out[name][f"{m}_sd"] = float(np.std(per_fold, ddof=1)) if len(per_fold) > 1 else 0.0
    return out
