"""Labelled multivariate time series for training and evaluating the learned detectors.

Every loader returns a ``Dataset``: one ``EntitySeries`` per entity (a server, a NAB series, a GPU), each with an
optional unlabelled or labelled ``train`` part (history) and a labelled ``test`` part. Formats:

- ``asd``: ../shared/data/asd/processed/omi-N_{train,test,test_label}.pkl (InterFusion, KDD'21): 19 metrics in
  [0, 1], 5-minute samples, train unlabelled, test labelled 0/1.
- ``nab``: ../shared/data/nab (Numenta): one ``timestamp,value`` CSV per series, anomaly windows from
  ``labels/combined_windows.json``. NAB has no train split; its first 15 % ("probationary period", NAB's own
  convention) is the train part.
- ``csv``: users' own data, one ``<entity>.csv`` per entity, documented in docs/detection.md: optional
  ``timestamp`` column, one column per metric, a ``label`` column (0 normal, 1 anomalous, or a class name) and
  an optional ``split`` column (``train`` / ``test``; without it the first half is train).
- ``sim``: windows cut from the simulator's runs (vigil_eval.simdata).

Bad data is either refused with a one-line VigilInputError or imputed in the documented way: NaN cells are
forward-filled then back-filled per metric (counted in ``EntitySeries.imputed``); a metric that is NaN
everywhere, a file with the wrong number of metrics, or labels of the wrong length are errors.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from vigil.detect.learned.windows import WindowSet, windows
from vigil.model import VigilInputError
from vigil.store.safe_pickle import load_array

ASD_METRICS = 19
NAB_PROBATION = 0.15
__all__ = ["WindowSet", "windows"]  # re-exported: the loaders' callers cut windows with them


@dataclass
class EntitySeries:
    """One entity's metrics: ``train`` history (labels optional) and a labelled ``test`` part."""

    entity: str
    test: np.ndarray
    test_labels: np.ndarray
    train: np.ndarray | None = None
    train_labels: np.ndarray | None = None
    imputed: int = 0
    train_context: np.ndarray | None = None
    test_context: np.ndarray | None = None

    @property
    def n_features(self) -> int:
        return int(self.test.shape[1])


@dataclass
class Dataset:
    name: str
    features: list[str]
    classes: list[str]
    entities: dict[str, EntitySeries] = field(default_factory=dict)

    def select(self, names: Sequence[str]) -> list[EntitySeries]:
        missing = [n for n in names if n not in self.entities]
        if missing:
            raise VigilInputError(f"data set {self.name!r} has no entity {missing[0]!r}; it has "
                                  f"{', '.join(sorted(self.entities))}")
        return [self.entities[n] for n in names]


# --------------------------------------------------------------------------- cleaning


def impute(values: np.ndarray, *, where: str) -> tuple[np.ndarray, int]:
    """Forward-fill then back-fill NaN / inf per metric; refuse a metric with no finite value at all."""
    arr = np.array(values, dtype=np.float32, copy=True)
    if arr.ndim != 2:
        raise VigilInputError(f"{where}: expected a (time x metrics) table, got shape {arr.shape}")
    bad = ~np.isfinite(arr)
    count = int(bad.sum())
    if not count:
        return arr, 0
    empty = np.flatnonzero(bad.all(axis=0))
    if empty.size:
        raise VigilInputError(f"{where}: metric column {int(empty[0])} has no finite value; drop it or fix the source")
    arr[bad] = np.nan
    idx = np.where(~bad, np.arange(len(arr))[:, None], 0)
    np.maximum.accumulate(idx, axis=0, out=idx)
    filled = arr[idx, np.arange(arr.shape[1])]
    # Leading NaNs have no earlier value: take the first finite one (back-fill).
    first = np.argmax(~bad, axis=0)
    lead = np.isnan(filled)
    filled[lead] = np.broadcast_to(arr[first, np.arange(arr.shape[1])], arr.shape)[lead]
    return filled, count


def _check_labels(labels: np.ndarray, length: int, *, where: str) -> np.ndarray:
    lab = np.asarray(labels).reshape(-1)
    if lab.shape[0] != length:
        raise VigilInputError(f"{where}: {lab.shape[0]} labels for {length} rows")
    if not np.isfinite(lab.astype(np.float64)).all() or (lab < 0).any():
        raise VigilInputError(f"{where}: labels must be non-negative integers")
    return lab.astype(np.int64)


# --------------------------------------------------------------------------- ASD / SMD


def read_array(path: Path) -> np.ndarray:
    """A numeric numpy array from a ``.pkl`` or ``.pkl.gz`` file (the ASD / SMD layout), read as data only
    (``vigil.store.safe_pickle``: only the names a plain ndarray needs are resolved)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise VigilInputError(f"missing data file {path}") from None
    except (OSError, EOFError) as err:
        raise VigilInputError(f"{path}: not readable ({err})") from None
    return load_array(raw, str(path))


def load_asd(root: Path, entities: Sequence[str] | None = None) -> Dataset:
    """ASD (or SMD with the same layout): ``processed/<entity>_{train,test,test_label}.pkl[.gz]``."""
    processed = root / "processed" if (root / "processed").is_dir() else root
    if not processed.is_dir():
        raise VigilInputError(f"ASD directory {root} does not exist")
    labelled = sorted({p.name.split("_test_label")[0] for p in processed.glob("*_test_label.pkl*")})
    # SMD ships labels for some machines whose metrics were never published: those are not entities.
    names = [n for n in labelled if any((processed / f"{n}_test{s}").exists() for s in (".pkl", ".pkl.gz"))]
    if entities:
        names = [n for n in names if n in set(entities)] or list(entities)
    if not names:
        raise VigilInputError(f"{processed}: no <entity>_test_label.pkl files (ASD layout)")
    data: dict[str, EntitySeries] = {}
    dims: int | None = None
    for name in names:
        suffix = ".pkl.gz" if (processed / f"{name}_test.pkl.gz").exists() else ".pkl"
        test, imputed = impute(read_array(processed / f"{name}_test{suffix}"), where=f"{name}_test")
        train_path = processed / f"{name}_train{suffix}"
        train = None
        if train_path.exists():
            train, extra = impute(read_array(train_path), where=f"{name}_train")
            imputed += extra
            if train.shape[1] != test.shape[1]:
                raise VigilInputError(f"{name}: train has {train.shape[1]} metrics, test {test.shape[1]}")
        labels = _check_labels(read_array(processed / f"{name}_test_label{suffix}"), len(test),
                               where=f"{name}_test_label")
        dims = dims or test.shape[1]
        if test.shape[1] != dims:
            raise VigilInputError(f"{name}: {test.shape[1]} metrics, other entities have {dims}")
        data[name] = EntitySeries(entity=name, test=test, test_labels=(labels > 0).astype(np.int64),
                                  train=train, imputed=imputed)
    assert dims is not None
    return Dataset(name=root.name or "asd", features=[f"m{i}" for i in range(dims)],
                   classes=["normal", "anomaly"], entities=data)


# --------------------------------------------------------------------------- NAB


def _parse_time(text: str, *, where: str) -> float:
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise VigilInputError(f"{where}: bad timestamp {text!r} (expected ISO 8601)") from None


def load_nab(root: Path, entities: Sequence[str] | None = None) -> Dataset:
    """NAB real series with their labelled anomaly windows; the probationary 15 % is the train part."""
    labels_path = root / "labels" / "combined_windows.json"
    try:
        windows_by_file = json.loads(labels_path.read_text())
    except FileNotFoundError:
        raise VigilInputError(f"NAB labels not found at {labels_path}") from None
    except json.JSONDecodeError as err:
        raise VigilInputError(f"{labels_path}: not valid JSON ({err.msg})") from None
    data: dict[str, EntitySeries] = {}
    for key, spans in sorted(windows_by_file.items()):
        path = root / "data" / key
        name = Path(key).stem
        if not path.exists() or (entities and name not in entities) or not key.startswith("real"):
            continue
        ts, vals = _read_table(path, ["value"])
        lab = np.zeros(len(ts), dtype=np.int64)
        for start, end in spans:
            lo, hi = _parse_time(start, where=str(labels_path)), _parse_time(end, where=str(labels_path))
            lab[(ts >= lo) & (ts <= hi)] = 1
        values, imputed = impute(vals, where=str(path))
        cut = int(len(ts) * NAB_PROBATION)
        data[name] = EntitySeries(entity=name, train=values[:cut], train_labels=lab[:cut], test=values[cut:],
                                  test_labels=lab[cut:], imputed=imputed)
    if not data:
        raise VigilInputError(f"{root}: no NAB series found (expected data/real*/*.csv)")
    return Dataset(name="nab", features=["value"], classes=["normal", "anomaly"], entities=data)


# --------------------------------------------------------------------------- user CSV


def _read_table(path: Path, metrics: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps (row numbers when absent) and a float table of ``metrics`` from a CSV file."""
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except FileNotFoundError:
        raise VigilInputError(f"missing data file {path}") from None
    except (UnicodeDecodeError, csv.Error) as err:
        raise VigilInputError(f"{path}: not a readable CSV file ({err})") from None
    if not rows:
        raise VigilInputError(f"{path}: no data rows")
    header = list(rows[0].keys())
    cols = list(metrics) if metrics is not None else [c for c in header if c not in ("timestamp", "label", "split")]
    missing = [c for c in cols if c not in header]
    if missing or not cols:
        raise VigilInputError(f"{path}: missing metric column {missing[0] if missing else '(none given)'!r}")
    table = np.full((len(rows), len(cols)), np.nan, dtype=np.float32)
    for i, row in enumerate(rows):
        for j, col in enumerate(cols):
            cell = (row.get(col) or "").strip()
            if cell:
                try:
                    table[i, j] = float(cell)
                except ValueError:
                    raise VigilInputError(f"{path}: row {i + 2} column {col!r}: {cell!r} is not a number") from None
    if "timestamp" in header:
        ts = np.array([_parse_time(r["timestamp"], where=f"{path} row {i + 2}") if not _is_number(r["timestamp"])
                       else float(r["timestamp"]) for i, r in enumerate(rows)])
        # Real exports hold rows out of order and re-sent samples (NAB has both): sort by time, stably,
        # and let the last row of a repeated timestamp win.
        order = np.argsort(ts, kind="stable")
        ts, table = ts[order], table[order]
        keep = np.r_[np.diff(ts) > 0, True]
        ts, table = ts[keep], table[keep]
    else:
        ts = np.arange(len(rows), dtype=np.float64)
    return ts, table


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_csv(root: Path, entities: Sequence[str] | None = None) -> Dataset:
    """Users' own data: one ``<entity>.csv`` per entity (format in docs/detection.md)."""
    files = sorted(root.glob("*.csv")) if root.is_dir() else ([root] if root.suffix == ".csv" else [])
    if entities:
        files = [f for f in files if f.stem in set(entities)]
    if not files:
        raise VigilInputError(f"{root}: no .csv files")
    features: list[str] | None = None
    parsed: list[tuple[str, np.ndarray, list[str], np.ndarray, int]] = []
    for path in files:
        with path.open(newline="") as fh:
            header = next(csv.reader(fh), [])
        if "label" not in header:
            raise VigilInputError(f"{path}: no 'label' column (0 normal, 1 anomaly, or a class name)")
        cols = [c for c in header if c not in ("timestamp", "label", "split")]
        if features is None:
            features = cols
        elif cols != features:
            raise VigilInputError(f"{path}: metric columns {cols} differ from the first file's {features}")
        _, table = _read_table(path, cols)
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        raw_labels = [(r.get("label") or "").strip() for r in rows]
        if "" in raw_labels:
            raise VigilInputError(f"{path}: row {raw_labels.index('') + 2} has an empty label")
        splits = [(r.get("split") or "").strip().lower() for r in rows]
        if any(s not in ("", "train", "test") for s in splits):
            raise VigilInputError(f"{path}: split values must be 'train' or 'test'")
        is_train = (np.array([s == "train" for s in splits]) if any(splits)
                    else np.arange(len(rows)) < len(rows) // 2)
        if is_train.all():
            raise VigilInputError(f"{path}: no test rows")
        values, imputed = impute(table, where=str(path))
        parsed.append((path.stem, values, raw_labels, is_train, imputed))
    assert features is not None
    classes = _classes([v for _, _, labels, _, _ in parsed for v in labels])
    index = {name: k for k, name in enumerate(classes)}
    data: dict[str, EntitySeries] = {}
    for name, values, raw_labels, is_train, imputed in parsed:
        labels = np.array([index[_class_name(v)] for v in raw_labels], dtype=np.int64)
        has_train = bool(is_train.any())
        data[name] = EntitySeries(entity=name, train=values[is_train] if has_train else None,
                                  train_labels=labels[is_train] if has_train else None,
                                  test=values[~is_train], test_labels=labels[~is_train], imputed=imputed)
    return Dataset(name=root.stem, features=features, classes=classes, entities=data)


def _class_name(value: str) -> str:
    """``0`` and ``normal`` are the normal class, ``1`` is ``anomaly``; any other value names a fault class."""
    return {"0": "normal", "1": "anomaly"}.get(value, value)


def _classes(values: Sequence[str]) -> list[str]:
    names = sorted({_class_name(v) for v in values} - {"normal"})
    return ["normal", *names] if names else ["normal", "anomaly"]
