"""A learned ranker over triage's candidate root lines, tried as an alternative to the hand-written choice in
:func:`vigil.logs.triage.decide`, trained and chosen on the development cases of the real-log corpus only by
leave-rounds-out cross-validation, and compared there with the rules. It did not win; the rules stay (docs/logs.md,
"A learned ranker, tried and rejected"). This module keeps the experiment reproducible (``bench/triage.py``).

Candidates. Every line triage's scan keeps - a signature hit, root or cascade, and every line no signature knows that
reads as an error - is a candidate. Each gets generic features (:data:`FEATURES`): which kind of signature matched and
how specific it is, whether it is an echo, an abort, a wrapper or NCCL's detail, its position in its file and among the
job's candidates, its timestamp order, how many lines report the same fault, its error words, and (in one variant)
whether the rules chose it. A model scores each candidate; the highest score is the root. The linear model is kept as
data (JSON: feature names, standardisation, coefficients; nothing in it is code).

Protocol. Development cases are grouped by collection round (rounds 3-5, held out whole but for the five cases moved to
development, form one group): each fold trains on the other rounds and names the root of every case of the left-out
round. The configuration (model, regularisation, with or without the rules' choice as a feature) with the most cases
right out of fold is chosen; its fold-by-fold score is the ranker's development CV figure. The rules cannot be refitted
per fold - they were written on every development case - so their development figure (in-sample) favours them; their
score on each round before the changes it led to (docs/benchmarks.md) is the prospective figure beside it. The
held-out cases are read only by :func:`held_out_once`, to be called only when the ranker wins in development CV.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.linear_model import LogisticRegression

from vigil.knowledge.signatures import signature_library
from vigil.logs.severity import SPECIFIC
from vigil.logs.sources import entity_name
from vigil.logs.triage import (
    ABORT_SIGNATURES,
    BARE_NCCL_REPORTS,
    CHILD_DEATH_REPORTS,
    ECHO_SIGNATURES,
    FIRST_OBSERVED,
    NCCL_LAST_ERROR,
    WORDED_SIGNATURE,
    LogEvent,
    TriageResult,
    _same_report,
    _Scan,
    _time_order,
    decide,
    scan_directory,
)
from vigil_eval.realcorpus import RealCase, load_cases

_ERROR_WORDS = re.compile(r"(?i)\b(?:error|errors|fail(?:ed|ure|s)?|exception|fatal|abort(?:ed)?|killed|invalid)\b")
_ECHO_WORDS = re.compile(r"(?i)time(?:d)? ?out|watchdog|closing signal|SIGTERM|ChildFailedError|heartbeat|"
                         r"dump(?:ing)? debug info|terminat")
_EXCEPTION_CLASS = re.compile(r"\b[A-Z][A-Za-z]*(?:Error|Exception|Failure)\b")

FEATURES: tuple[str, ...] = (
    "rules_root",            # the hand-written rules chose this line
    "signature",             # a signature of the library matched
    "signature_role_root",   # ... one that can start a failure
    "signature_priority",    # 1 for the library's most specific signature, towards 0 for the least
    "worded_specific",       # no signature; the wording names what failed
    "worded_generic",        # no signature; only an error word
    "level",                 # the signature's fault level, 0..1
    "echo",                  # a symptom every healthy peer prints (watchdog, launcher report)
    "abort",                 # a process aborting after its own report
    "bare_wrapper",          # names only NCCL's error class
    "child_death",           # reports a child process's death
    "nccl_detail",           # the line under NCCL's "Last error:"
    "first_observed",        # torchelastic's "Root Cause (first observed failure)"
    "traceback",             # ends a Python traceback
    "detail_fields",         # fields of its signature it filled, log1p
    "node_log",              # a kernel log, not a rank's
    "first_in_file",         # the first candidate of its file
    "file_position",         # index among its file's candidates, 0..1
    "line_position",         # line number over its file's lines, 0..1
    "time_order",            # index among the job's candidates in time order, 0..1
    "earliest",              # stamped within a second of the job's earliest candidate
    "untimed",               # no timestamp (and none above it)
    "later_same_report",     # later candidates of its file reporting the same fault, log1p
    "same_kind_job",         # candidates of the job with its kind, log1p
    "error_words",           # error words in the line, log1p
    "echo_words",            # timeout / watchdog / terminate words in the line
    "exception_class",       # names an exception class
    "nccl_warn",             # an NCCL WARN line
    "length",                # characters, log1p / 8
    "candidates",            # candidates in the job, log1p
)


@dataclass(frozen=True)
class Candidate:
    event: LogEvent
    features: tuple[float, ...]


def candidates(scans: Sequence[_Scan], result: TriageResult, tie_s: float = 1.0) -> list[Candidate]:
    """Every line the scan kept, with its features; the rules' choice is ``result.root``."""
    library = signature_library()
    priority = {s.id: i for i, s in enumerate(library)}
    last = max(len(library) - 1, 1)
    events = ([e for scan in scans for e in scan.events] + [e for scan in scans for e in scan.worded]
              + [scan.trace for scan in scans if scan.trace is not None])  # NCCL's return-code trace: a last choice
    if not events:
        return []
    lines = {scan.source.name: max(scan.lines, 1) for scan in scans}
    by_file: dict[str, list[LogEvent]] = {}
    for event in events:
        by_file.setdefault(event.source, []).append(event)
    for group in by_file.values():
        group.sort(key=lambda e: e.lineno)
    ordered = sorted(events, key=_time_order)
    when = {id(e): i for i, e in enumerate(ordered)}
    stamps = [e.ts for e in events if e.ts is not None]
    first_ts = min(stamps) if stamps else None
    kinds = Counter(e.kind for e in events)
    total = len(events)
    root = result.root
    out = []
    for event in events:
        group = by_file[event.source]
        index = next(i for i, e in enumerate(group) if e is event)
        later = sum(1 for e in group[index + 1:] if _same_report(e, event))
        worded = event.signature == WORDED_SIGNATURE
        grade = event.attrs.get("strength", 0) if worded else 0
        line = event.line
        values = {
            "rules_root": float(root is not None and event.source == root.source and event.lineno == root.lineno),
            "signature": float(not worded),
            "signature_role_root": float(not worded and event.role == "root" and event.signature in priority),
            "signature_priority": 0.0 if worded else 1.0 - priority.get(event.signature, last) / last,
            "worded_specific": float(worded and grade == SPECIFIC),
            "worded_generic": float(worded and grade != SPECIFIC),
            "level": 0.0 if worded else int(event.level) / 4.0,
            "echo": float(event.signature in ECHO_SIGNATURES),
            "abort": float(event.signature in ABORT_SIGNATURES),
            "bare_wrapper": float(event.signature in BARE_NCCL_REPORTS),
            "child_death": float(event.signature in CHILD_DEATH_REPORTS),
            "nccl_detail": float(bool(event.attrs.get(NCCL_LAST_ERROR))),
            "first_observed": float(bool(event.attrs.get(FIRST_OBSERVED))),
            "traceback": float("frames" in event.attrs),
            "detail_fields": math.log1p(sum(1 for k, v in event.attrs.items()
                                            if k not in ("frames", "user_frame", "strength", NCCL_LAST_ERROR)
                                            and v not in (None, ""))),
            "node_log": float(event.entity.startswith("node/")),
            "first_in_file": float(index == 0),
            "file_position": index / max(len(group) - 1, 1),
            "line_position": event.lineno / lines.get(event.source, event.lineno),
            "time_order": when[id(event)] / max(total - 1, 1),
            "earliest": float(event.ts is not None and first_ts is not None and event.ts <= first_ts + tie_s),
            "untimed": float(event.ts is None),
            "later_same_report": math.log1p(later),
            "same_kind_job": math.log1p(kinds[event.kind] - 1),
            "error_words": math.log1p(len(_ERROR_WORDS.findall(line))),
            "echo_words": float(bool(_ECHO_WORDS.search(line))),
            "exception_class": float(bool(_EXCEPTION_CLASS.search(line))),
            "nccl_warn": float("NCCL WARN" in line),
            "length": math.log1p(len(line)) / 8.0,
            "candidates": math.log1p(total),
        }
        out.append(Candidate(event, tuple(values[name] for name in FEATURES)))
    return out


@dataclass(frozen=True)
class RankerModel:
    """A linear score over standardised features: ``sum(coef * (x - mean) / scale)``."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    meta: dict[str, Any]

    def score(self, features: Sequence[float]) -> float:
        return sum(c * (x - m) / s for c, x, m, s in zip(self.coef, features, self.mean, self.scale, strict=True))

    def pick(self, found: Sequence[Candidate]) -> Candidate | None:
        """The highest-scoring candidate; ties go to the earlier one in time order."""
        if not found:
            return None
        order = {id(c): i for i, c in enumerate(sorted(found, key=lambda c: _time_order(c.event)))}
        return max(found, key=lambda c: (self.score(c.features), -order[id(c)]))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "linear", "features": list(self.features), "mean": list(self.mean),
                "scale": list(self.scale), "coef": list(self.coef), "meta": self.meta}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankerModel:
        if data.get("kind") != "linear":
            raise ValueError(f"ranker model: kind {data.get('kind')!r}, expected 'linear'")
        names = tuple(str(n) for n in data["features"])
        unknown = set(names) - set(FEATURES)
        if unknown or names != tuple(n for n in FEATURES if n in names):
            raise ValueError(f"ranker model: features {sorted(unknown) or names} do not match this version")
        mean, scale, coef = (tuple(float(v) for v in data[k]) for k in ("mean", "scale", "coef"))
        if not len(names) == len(mean) == len(scale) == len(coef) or any(s <= 0 for s in scale):
            raise ValueError("ranker model: feature, mean, scale and coef lengths differ or a scale is not positive")
        return cls(names, mean, scale, coef, dict(data.get("meta", {})))

    def select(self, values: Sequence[float]) -> tuple[float, ...]:
        """The model's features out of a full :data:`FEATURES` vector."""
        return tuple(values[FEATURES.index(n)] for n in self.features)

    def pick_full(self, found: Sequence[Candidate]) -> Candidate | None:
        """:meth:`pick` over candidates whose features are the full :data:`FEATURES` vector."""
        return self.pick([Candidate(c.event, self.select(c.features)) for c in found])


def load_model(path: Path) -> RankerModel:
    return RankerModel.from_json(json.loads(path.read_text(encoding="utf-8")))


def triage_ranked(directory: Path, model: RankerModel, job: str | None = None,
                  tie_s: float = 1.0, workers: int | None = 1) -> tuple[TriageResult, LogEvent | None]:
    """The rules' verdict on a job's logs and the root the ranker picks from the same scan."""
    job_name = entity_name(job or directory.resolve().name, "job")
    scans = scan_directory(directory, job_name, workers=workers)
    result = decide(scans, job_name, directory, tie_s)
    picked = model.pick_full(candidates(scans, result, tie_s))
    return result, None if picked is None else picked.event


def group_of(case: RealCase) -> str:
    """The cross-validation group of a development case: its collection round (3-5 together)."""
    return "3-5" if 3 <= case.batch <= 5 else str(case.batch)


@dataclass
class CaseData:
    case: RealCase
    candidates: list[Candidate]
    labels: list[int]  # 1 for a candidate the case accepts as its root line
    rules_right: bool

    def right(self, index: int | None) -> bool:
        return index is not None and bool(self.labels[index])


def case_data(case: RealCase) -> CaseData:
    job = entity_name(case.id, "job")
    scans = scan_directory(case.directory, job, workers=1)
    result = decide(scans, job, case.directory)
    found = candidates(scans, result)
    labels = [int(case.is_root(c.event.source, c.event.lineno)) for c in found]
    return CaseData(case, found, labels, case.accepts(result))


@dataclass(frozen=True)
class Config:
    model: str  # "logistic" or "boosting"
    c: float  # logistic: inverse regularisation; boosting: number of trees
    rules_feature: bool

    @property
    def name(self) -> str:
        size = f"C={self.c:g}" if self.model == "logistic" else f"trees={int(self.c)}"
        return f"{self.model} {size}, {'with' if self.rules_feature else 'without'} the rules' choice"

    def features(self) -> tuple[str, ...]:
        return FEATURES if self.rules_feature else tuple(f for f in FEATURES if f != "rules_root")


CONFIGS = tuple([Config("logistic", c, r) for r in (True, False) for c in (0.01, 0.1, 1.0, 10.0)]
                + [Config("boosting", n, r) for r in (True, False) for n in (50, 200)])


def _matrix(cases: list[CaseData], names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    columns = [FEATURES.index(n) for n in names]
    rows = [[c.features[i] for i in columns] for d in cases for c in d.candidates]
    labels = [y for d in cases for y in d.labels]
    return np.array(rows, dtype=float).reshape(-1, len(columns)), np.array(labels, dtype=int)


def fit(cases: list[CaseData], config: Config) -> Any:
    """A linear :class:`RankerModel` (logistic) or a fitted scikit-learn booster (boosting, CV only)."""
    names = config.features()
    x, y = _matrix(cases, names)
    if config.model == "boosting":
        booster = GradientBoostingClassifier(n_estimators=int(config.c), max_depth=2, learning_rate=0.1,
                                             subsample=1.0, random_state=0)
        booster.fit(x, y)
        return (names, booster)
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    logistic = LogisticRegression(C=config.c, class_weight="balanced", max_iter=2000)
    logistic.fit((x - mean) / scale, y)
    return RankerModel(names, tuple(mean.tolist()), tuple(scale.tolist()), tuple(logistic.coef_[0].tolist()),
                       {"config": config.name, "trained_on": len(cases)})


def pick(model: Any, data: CaseData) -> int | None:
    """The index of the candidate the model names as the root."""
    if not data.candidates:
        return None
    if isinstance(model, RankerModel):
        chosen = model.pick_full(data.candidates)
        return None if chosen is None else next(i for i, c in enumerate(data.candidates) if c.event is chosen.event)
    names, booster = model
    x, _ = _matrix([data], names)
    scores = booster.predict_proba(x)[:, 1]
    return int(np.argmax(scores))  # ties: the first in file order


def cross_validate(dev: list[CaseData], config: Config) -> dict[str, Any]:
    groups: dict[str, list[CaseData]] = defaultdict(list)
    for data in dev:
        groups[group_of(data.case)].append(data)
    folds = {}
    for name, held in sorted(groups.items()):
        train = [d for g, ds in groups.items() if g != name for d in ds]
        model = fit(train, config)
        folds[name] = {"cases": len(held), "right": sum(d.right(pick(model, d)) for d in held),
                       "rules_right": sum(d.rules_right for d in held)}
    return {"config": config.name, "folds": folds, "right": sum(f["right"] for f in folds.values()),
            "cases": len(dev)}


def development_cv(configs: tuple[Config, ...] = CONFIGS) -> dict[str, Any]:
    """Every configuration's leave-rounds-out score on the development cases; the chosen one first."""
    started = time.perf_counter()
    dev = [case_data(c) for c in load_cases() if c.split == "development"]
    runs = [cross_validate(dev, config) for config in configs]
    best = max(range(len(runs)), key=lambda i: (runs[i]["right"], -i))
    coverage = sum(any(d.labels) for d in dev)
    return {"chosen": runs[best]["config"], "chosen_index": best, "runs": runs,
            "rules_development": sum(d.rules_right for d in dev), "cases": len(dev),
            "root_among_candidates": coverage, "seconds": time.perf_counter() - started}


def train_final(config: Config, path: Path | None = None) -> RankerModel:
    """The chosen linear configuration trained on every development case, written as JSON."""
    if config.model != "logistic":
        raise ValueError("only the linear ranker is stored")
    dev = [case_data(c) for c in load_cases() if c.split == "development"]
    model = fit(dev, config)
    if path is not None:
        path.write_text(json.dumps(model.to_json(), indent=1) + "\n", encoding="utf-8")
    if not isinstance(model, RankerModel):
        raise TypeError("the logistic configuration fits a RankerModel")
    return model


def held_out_once(model: RankerModel) -> dict[str, Any]:
    """The ranker and the rules on the held-out cases: to be run once, after the development decision."""
    held = [case_data(c) for c in load_cases() if c.split == "held_out"]
    return {"cases": len(held), "ranker": sum(d.right(pick(model, d)) for d in held),
            "rules": sum(d.rules_right for d in held)}
