"""Tiered retention for the embedded metrics store: raw frames for 24 h, aggregates for 30 days.

``RetentionJob.run(now)`` is the downsampling job (run it hourly; `vigil agent --store` does):

1. every *complete* ``step_s`` bucket (5 min by default) of raw frames not yet aggregated becomes one
   aggregate row per entity and metric: mean, min, max, last and count of the non-missing samples;
2. aggregate segments are written as compressed files (``vigil.store.compress``: delta-of-delta for the
   bucket times, the smallest of delta / XOR / raw per series) under ``<path>/``;
3. raw frames older than ``raw_s`` are dropped, aggregate segments older than ``aggregate_s`` too.

A watermark per family (in ``watermarks.json``) makes the job idempotent: running it twice, or after a crash,
never aggregates a bucket twice. The raw tier is the lead's ``MetricStore``, used only through its public API
(``window``, ``append``, ``flush``): expiring raw frames rewrites the store without them into a fresh
directory and swaps it in, so a crash mid-way leaves the old store intact.
"""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vigil.model import VigilInputError
from vigil.store.compress import decode, encode
from vigil.store.metrics import MetricFrame, MetricStore

STATS = ("mean", "min", "max", "last", "count")
_SEGMENT_SUFFIX = ".vza"


@dataclass(frozen=True)
class RetentionPolicy:
    raw_s: float = 24 * 3600.0
    aggregate_s: float = 30 * 86400.0
    step_s: float = 300.0

    def __post_init__(self) -> None:
        if self.step_s <= 0 or self.raw_s <= 0 or self.aggregate_s <= 0:
            raise VigilInputError("retention periods and the aggregation step must be positive")
        if self.raw_s < self.step_s:
            raise VigilInputError(
                f"raw retention ({self.raw_s:g}s) is shorter than the aggregation step ({self.step_s:g}s): "
                "frames would expire before they are aggregated"
            )


@dataclass
class Segment:
    """Aggregates of one family over consecutive buckets: ``stats[name][bucket, entity, metric]``."""

    family: str
    ts: np.ndarray
    entities: list[str]
    metrics: list[str]
    stats: dict[str, np.ndarray]

    @property
    def end(self) -> float:
        return float(self.ts[-1]) if len(self.ts) else 0.0


def downsample(ts: np.ndarray, values: np.ndarray, step_s: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Bucket frames (ts[n], values[n, ...]) by ``step_s``; NaN (missing) samples are left out of every stat.

    Returns bucket start times and, per stat, an array (buckets, ...); a bucket with no valid sample has NaN
    mean/min/max/last and count 0.
    """
    if len(ts) == 0:
        return np.empty(0), {s: np.empty((0, *values.shape[1:]), dtype=np.float32) for s in STATS}
    buckets = np.floor(ts / step_s).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
    valid = ~np.isnan(values)
    data = values.astype(np.float64)
    count = np.add.reduceat(valid, starts, axis=0).astype(np.float32)
    total = np.add.reduceat(np.where(valid, data, 0.0), starts, axis=0)
    low = np.minimum.reduceat(np.where(valid, data, np.inf), starts, axis=0)
    high = np.maximum.reduceat(np.where(valid, data, -np.inf), starts, axis=0)
    # last valid value per bucket: forward-fill within the bucket, then take each bucket's final row
    index = np.where(valid, np.arange(len(ts)).reshape(-1, *([1] * (values.ndim - 1))), -1)
    index = np.maximum.accumulate(index, axis=0)
    ends = np.r_[starts[1:], len(ts)] - 1
    last_index = index[ends]
    bucket_first = starts.reshape(-1, *([1] * (values.ndim - 1)))
    has_last = last_index >= bucket_first
    last = np.where(has_last, np.take_along_axis(data, np.maximum(last_index, 0), axis=0), np.nan)
    empty = count == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(empty, np.nan, total / np.maximum(count, 1))
    stats = {
        "mean": mean.astype(np.float32),
        "min": np.where(empty, np.nan, low).astype(np.float32),
        "max": np.where(empty, np.nan, high).astype(np.float32),
        "last": last.astype(np.float32),
        "count": count,
    }
    return buckets[starts].astype(np.float64) * step_s, stats


class AggregateTier:
    """The long tier: compressed aggregate segments per family, optionally persisted under ``path``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.segments: dict[str, list[Segment]] = {}
        self._files: dict[int, Path] = {}
        if path is not None and path.is_dir():
            for file in sorted(path.glob(f"*{_SEGMENT_SUFFIX}")):
                segment = read_segment(file)
                self.segments.setdefault(segment.family, []).append(segment)
                self._files[id(segment)] = file
            for segments in self.segments.values():
                segments.sort(key=lambda s: float(s.ts[0]))

    def add(self, segment: Segment) -> int:
        """Store a segment; returns its size in bytes on disk (0 for an in-memory tier)."""
        self.segments.setdefault(segment.family, []).append(segment)
        if self.path is None:
            return 0
        self.path.mkdir(parents=True, exist_ok=True)
        file = self.path / f"{segment.family}.{int(segment.ts[0])}{_SEGMENT_SUFFIX}"
        size = write_segment(segment, file)
        self._files[id(segment)] = file
        return size

    def series(
        self, entity: str, metric: str, stat: str = "mean", start: float | None = None, end: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if stat not in STATS:
            raise VigilInputError(f"unknown aggregate {stat!r}: expected one of {', '.join(STATS)}")
        ts_parts, value_parts = [], []
        for segments in self.segments.values():
            for segment in segments:
                if entity not in segment.entities or metric not in segment.metrics:
                    continue
                i, j = segment.entities.index(entity), segment.metrics.index(metric)
                mask = np.ones(len(segment.ts), dtype=bool)
                if start is not None:
                    mask &= segment.ts >= start
                if end is not None:
                    mask &= segment.ts <= end
                ts_parts.append(segment.ts[mask])
                value_parts.append(segment.stats[stat][mask, i, j])
        if not ts_parts:
            return np.empty(0), np.empty(0, dtype=np.float32)
        ts, values = np.concatenate(ts_parts), np.concatenate(value_parts)
        order = np.argsort(ts, kind="stable")
        return ts[order], values[order]

    def expire(self, before: float) -> int:
        """Drop segments whose last bucket starts before ``before``; returns how many were dropped."""
        dropped = 0
        for family, segments in self.segments.items():
            kept = []
            for segment in segments:
                if segment.end < before:
                    dropped += 1
                    file = self._files.pop(id(segment), None)
                    if file is not None:
                        file.unlink(missing_ok=True)
                else:
                    kept.append(segment)
            self.segments[family] = kept
        return dropped


# --------------------------------------------------------------------------- segment files

_FILE_MAGIC = b"VZA1"


def write_segment(segment: Segment, file: Path) -> int:
    """One file: magic, a JSON header (names, block sizes), then compressed blocks. Written atomically."""
    blocks = [encode(segment.ts).data]
    for stat in STATS:
        cube = segment.stats[stat]
        for i in range(len(segment.entities)):
            for j in range(len(segment.metrics)):
                blocks.append(encode(np.ascontiguousarray(cube[:, i, j])).data)
    header = json.dumps(
        {
            "family": segment.family,
            "entities": segment.entities,
            "metrics": segment.metrics,
            "stats": list(STATS),
            "sizes": [len(b) for b in blocks],
        }
    ).encode()
    tmp = file.with_suffix(".tmp")
    with tmp.open("wb") as fh:
        fh.write(_FILE_MAGIC + struct.pack("<I", len(header)) + header)
        for block in blocks:
            fh.write(block)
    tmp.replace(file)
    return file.stat().st_size


def read_segment(file: Path) -> Segment:
    data = file.read_bytes()
    if data[:4] != _FILE_MAGIC or len(data) < 8:
        raise VigilInputError(f"aggregate segment {file} is not a Vigil segment file (bad magic)")
    (header_len,) = struct.unpack_from("<I", data, 4)
    try:
        header = json.loads(data[8 : 8 + header_len])
        sizes, entities, metrics = header["sizes"], header["entities"], header["metrics"]
    except (ValueError, KeyError) as err:
        raise VigilInputError(f"aggregate segment {file} has a corrupt header: {err}") from None
    if 8 + header_len + sum(sizes) != len(data):
        raise VigilInputError(
            f"aggregate segment {file} is truncated: expected {8 + header_len + sum(sizes)} bytes, found {len(data)}"
        )
    offset = 8 + header_len
    blocks = []
    for size in sizes:
        blocks.append(decode(data[offset : offset + size]))
        offset += size
    ts = blocks[0]
    n_series = len(entities) * len(metrics)
    stats = {}
    for k, stat in enumerate(header["stats"]):
        columns = blocks[1 + k * n_series : 1 + (k + 1) * n_series]
        cube = np.stack(columns, axis=1) if columns else np.empty((len(ts), 0), dtype=np.float32)
        stats[stat] = cube.reshape(len(ts), len(entities), len(metrics))
    return Segment(header["family"], ts, entities, metrics, stats)


# --------------------------------------------------------------------------- the job


@dataclass
class RetentionReport:
    buckets_aggregated: int = 0
    raw_frames_expired: int = 0
    segments_expired: int = 0
    aggregate_bytes: int = 0
    families: dict[str, int] = field(default_factory=dict)


class RetentionJob:
    """Downsample, then expire, both tiers. ``raw`` is replaced when raw frames expire: read it from here."""

    def __init__(self, raw: MetricStore, tier: AggregateTier, policy: RetentionPolicy | None = None) -> None:
        self.raw = raw
        self.tier = tier
        self.policy = policy or RetentionPolicy()
        self.watermarks: dict[str, float] = {}
        if tier.path is not None and (tier.path / "watermarks.json").exists():
            self.watermarks = json.loads((tier.path / "watermarks.json").read_text())

    def run(self, now: float) -> RetentionReport:
        report = RetentionReport()
        step = self.policy.step_s
        complete_end = np.floor(now / step) * step
        for family in self.raw.families():
            ts, values = self.raw.window(family, self.raw.frame_count(family))
            since = self.watermarks.get(family, -np.inf)
            mask = (ts >= since) & (ts < complete_end)
            if not mask.any():
                continue
            bucket_ts, stats = downsample(ts[mask], values[mask], step)
            segment = Segment(family, bucket_ts, self.raw.entities(family), self.raw.metrics(family), stats)
            report.aggregate_bytes += self.tier.add(segment)
            report.buckets_aggregated += len(bucket_ts)
            report.families[family] = len(bucket_ts)
            self.watermarks[family] = float(complete_end)
        self._save_watermarks()
        report.segments_expired = self.tier.expire(now - self.policy.aggregate_s)
        report.raw_frames_expired = self._expire_raw(now - self.policy.raw_s)
        return report

    def _save_watermarks(self) -> None:
        if self.tier.path is None:
            return
        self.tier.path.mkdir(parents=True, exist_ok=True)
        tmp = self.tier.path / "watermarks.json.tmp"
        tmp.write_text(json.dumps(self.watermarks))
        tmp.replace(self.tier.path / "watermarks.json")

    def _expire_raw(self, cutoff: float) -> int:
        families = self.raw.families()
        expired = 0
        for family in families:
            ts, _ = self.raw.window(family, self.raw.frame_count(family))
            expired += int((ts < cutoff).sum())
        if expired == 0:
            return 0
        path = self.raw.path
        staging = None if path is None else path.with_name(path.name + ".retention")
        if staging is not None and staging.exists():
            shutil.rmtree(staging)
        kept = MetricStore(staging)
        for family in families:
            entities, metrics = self.raw.entities(family), self.raw.metrics(family)
            ts, values = self.raw.window(family, self.raw.frame_count(family))
            for k in np.flatnonzero(ts >= cutoff):
                kept.append(MetricFrame(float(ts[k]), family, entities, metrics, values[k]))
        if path is not None and staging is not None:
            kept.flush()
            retired = path.with_name(path.name + ".expired")
            if retired.exists():
                shutil.rmtree(retired)
            if path.exists():
                path.rename(retired)
            staging.rename(path)
            shutil.rmtree(retired, ignore_errors=True)
            kept = MetricStore(path)
        self.raw = kept
        return expired
