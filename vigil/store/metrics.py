"""Embedded columnar metrics store.

A scrape of one metric family (``gpu``, ``node``, ``nic``, ``job``) at one time is a ``MetricFrame``: a dense
(entities x metrics) float32 matrix. Frames of a family share one entity list and one metric list, so a
family's history is a (time x entities x metrics) cube kept in chunks: appends are O(1), a rule evaluates a
whole scrape with a few numpy operations, and a 10,000-GPU cluster fits in memory for hours.

Missing values are NaN (a GPU that fell off the bus has no metrics). Persistence writes one ``.npz`` per
family chunk under the store's directory; at cluster scale the same frames go to Prometheus /
VictoriaMetrics instead (see vigil/faces/api).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vigil.model import VigilInputError

CHUNK_FRAMES = 256


@dataclass(frozen=True)
class MetricFrame:
    """One scrape of one family: ``values[i, j]`` is metric ``metrics[j]`` of entity ``entities[i]``."""

    ts: float
    family: str
    entities: Sequence[str]
    metrics: Sequence[str]
    values: np.ndarray

    def __post_init__(self) -> None:
        shape = (len(self.entities), len(self.metrics))
        if self.values.shape != shape:
            raise VigilInputError(
                f"metric frame {self.family!r} at ts={self.ts}: values shape {self.values.shape} does not match "
                f"{shape[0]} entities x {shape[1]} metrics"
            )

    def column(self, metric: str) -> np.ndarray:
        return self.values[:, self.metric_index(metric)]

    def metric_index(self, metric: str) -> int:
        try:
            return list(self.metrics).index(metric)
        except ValueError:
            raise VigilInputError(f"metric {metric!r} is not in family {self.family!r}") from None

    @property
    def sample_count(self) -> int:
        return int(self.values.size)


@dataclass
class _Family:
    entities: list[str]
    metrics: list[str]
    entity_index: dict[str, int]
    metric_index: dict[str, int]
    ts_chunks: list[np.ndarray] = field(default_factory=list)
    value_chunks: list[np.ndarray] = field(default_factory=list)
    ts_buf: np.ndarray = field(default_factory=lambda: np.empty(0))
    value_buf: np.ndarray = field(default_factory=lambda: np.empty(0))
    fill: int = 0
    flushed_chunks: int = 0

    def new_buffer(self) -> None:
        self.ts_buf = np.empty(CHUNK_FRAMES, dtype=np.float64)
        self.value_buf = np.empty((CHUNK_FRAMES, len(self.entities), len(self.metrics)), dtype=np.float32)
        self.fill = 0

    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        yield from zip(self.ts_chunks, self.value_chunks, strict=True)
        if self.fill:
            yield self.ts_buf[: self.fill], self.value_buf[: self.fill]


def _read_chunk(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One stored chunk's timestamps and values; a missing, truncated or foreign file is one clear error (the
    file is left as it is, so nothing stored is lost)."""
    try:
        with np.load(path) as data:
            return np.asarray(data["ts"]), np.asarray(data["values"])
    except FileNotFoundError:
        raise VigilInputError(f"metric chunk {path} is missing; the metrics index lists it") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        raise VigilInputError(f"metric chunk {path} is corrupt: expected a numpy archive with ts and values "
                              "arrays") from None


class MetricStore:
    """Append frames, read series and windows back; optionally persisted under ``path``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._families: dict[str, _Family] = {}
        if path is not None and (path / "index.json").exists():
            self._load()

    # ---------------------------------------------------------------- writing

    def append(self, frame: MetricFrame) -> None:
        fam = self._families.get(frame.family)
        if fam is None:
            fam = _Family(
                entities=list(frame.entities),
                metrics=list(frame.metrics),
                entity_index={e: i for i, e in enumerate(frame.entities)},
                metric_index={m: j for j, m in enumerate(frame.metrics)},
            )
            fam.new_buffer()
            self._families[frame.family] = fam
        elif len(frame.entities) != len(fam.entities) or len(frame.metrics) != len(fam.metrics):
            raise VigilInputError(
                f"frame for family {frame.family!r} has {len(frame.entities)} entities x {len(frame.metrics)} "
                f"metrics; the family was created with {len(fam.entities)} x {len(fam.metrics)}"
            )
        if fam.fill and frame.ts < fam.ts_buf[fam.fill - 1]:
            raise VigilInputError(f"frame for family {frame.family!r} at ts={frame.ts} is older than the last one")
        fam.ts_buf[fam.fill] = frame.ts
        fam.value_buf[fam.fill] = frame.values
        fam.fill += 1
        if fam.fill == CHUNK_FRAMES:
            fam.ts_chunks.append(fam.ts_buf)
            fam.value_chunks.append(fam.value_buf)
            fam.new_buffer()

    def flush(self) -> None:
        """Write sealed chunks and the open buffer to disk (no-op for an in-memory store)."""
        if self.path is None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        index = {}
        for name, fam in self._families.items():
            for k in range(fam.flushed_chunks, len(fam.ts_chunks)):
                np.savez(self.path / f"{name}.{k:06d}.npz", ts=fam.ts_chunks[k], values=fam.value_chunks[k])
            fam.flushed_chunks = len(fam.ts_chunks)
            np.savez(self.path / f"{name}.open.npz", ts=fam.ts_buf[: fam.fill], values=fam.value_buf[: fam.fill])
            index[name] = {"entities": fam.entities, "metrics": fam.metrics, "chunks": fam.flushed_chunks}
        tmp = self.path / "index.json.tmp"
        tmp.write_text(json.dumps(index))
        tmp.replace(self.path / "index.json")

    def _load(self) -> None:
        assert self.path is not None
        index_file = self.path / "index.json"
        try:
            index = json.loads(index_file.read_text())
        except json.JSONDecodeError as err:
            raise VigilInputError(f"metrics index {index_file} is corrupt: {err.msg}") from None
        try:
            for name, meta in index.items():
                self._families[name] = self._load_family(name, meta)
        except VigilInputError:
            raise
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise VigilInputError(f"metrics index {index_file} is corrupt: unexpected layout ({err})") from None

    def _load_family(self, name: str, meta: dict[str, Any]) -> _Family:
        assert self.path is not None
        entities, metrics = list(meta["entities"]), list(meta["metrics"])
        fam = _Family(
            entities=entities,
            metrics=metrics,
            entity_index={e: i for i, e in enumerate(entities)},
            metric_index={m: j for j, m in enumerate(metrics)},
        )
        chunks = int(meta["chunks"])
        for k in range(chunks):
            ts, values = _read_chunk(self.path / f"{name}.{k:06d}.npz")
            fam.ts_chunks.append(ts)
            fam.value_chunks.append(values)
        fam.flushed_chunks = chunks
        fam.new_buffer()
        open_file = self.path / f"{name}.open.npz"
        if open_file.exists():
            ts, values = _read_chunk(open_file)
            n = len(ts)
            fam.ts_buf[:n] = ts
            fam.value_buf[:n] = values
            fam.fill = n
        return fam

    # ---------------------------------------------------------------- reading

    def families(self) -> list[str]:
        return sorted(self._families)

    def entities(self, family: str) -> list[str]:
        return list(self._family(family).entities)

    def metrics(self, family: str) -> list[str]:
        return list(self._family(family).metrics)

    def family_of(self, entity: str) -> str | None:
        for name, fam in self._families.items():
            if entity in fam.entity_index:
                return name
        return None

    def series(
        self, entity: str, metric: str, start: float | None = None, end: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Timestamps and values of one metric of one entity, optionally within [start, end]."""
        family = self.family_of(entity)
        if family is None:
            raise VigilInputError(f"no metrics stored for entity {entity!r}")
        fam = self._families[family]
        if metric not in fam.metric_index:
            raise VigilInputError(f"metric {metric!r} is not stored for {entity!r} (family {family!r})")
        i, j = fam.entity_index[entity], fam.metric_index[metric]
        ts_parts, val_parts = [], []
        for ts, values in fam.chunks():
            mask = np.ones(len(ts), dtype=bool)
            if start is not None:
                mask &= ts >= start
            if end is not None:
                mask &= ts <= end
            if mask.any():
                ts_parts.append(ts[mask])
                val_parts.append(values[mask, i, j])
        if not ts_parts:
            return np.empty(0), np.empty(0, dtype=np.float32)
        return np.concatenate(ts_parts), np.concatenate(val_parts)

    def window(self, family: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The last ``n`` frames of a family: (ts[n'], values[n', entities, metrics]) with n' <= n."""
        fam = self._family(family)
        ts_parts: list[np.ndarray] = []
        val_parts: list[np.ndarray] = []
        remaining = n
        for ts, values in reversed(list(fam.chunks())):
            take = min(remaining, len(ts))
            ts_parts.insert(0, ts[len(ts) - take:])
            val_parts.insert(0, values[len(ts) - take:])
            remaining -= take
            if remaining == 0:
                break
        if not ts_parts:
            return np.empty(0), np.empty((0, len(fam.entities), len(fam.metrics)), dtype=np.float32)
        return np.concatenate(ts_parts), np.concatenate(val_parts)

    def between(self, family: str, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        """Every frame of a family with ``start <= ts <= end``: (ts[n], values[n, entities, metrics])."""
        fam = self._family(family)
        ts_parts: list[np.ndarray] = []
        val_parts: list[np.ndarray] = []
        for ts, values in fam.chunks():
            mask = (ts >= start) & (ts <= end)
            if mask.any():
                ts_parts.append(ts[mask])
                val_parts.append(values[mask])
        if not ts_parts:
            return np.empty(0), np.empty((0, len(fam.entities), len(fam.metrics)), dtype=np.float32)
        return np.concatenate(ts_parts), np.concatenate(val_parts)

    def frame_count(self, family: str) -> int:
        fam = self._family(family)
        return sum(len(ts) for ts in fam.ts_chunks) + fam.fill

    def _family(self, family: str) -> _Family:
        try:
            return self._families[family]
        except KeyError:
            raise VigilInputError(f"no metric family {family!r} in the store") from None
