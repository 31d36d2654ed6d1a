"""The agent's own embedded history (``vigil agent --store DIR``): frames per family, tiered retention.

Latest points become one ``MetricFrame`` per family (gpu, node, nic) on every record tick, appended to the
embedded ``MetricStore``; ``RetentionJob`` (vigil/store/retention.py) runs every ``retention_every_s`` to
downsample complete buckets into compressed aggregates and expire old raw frames. A family's layout
(entities x metrics) is fixed by its first frame, which is taken only once every source has answered or
timed out; a metric or entity that appears later is counted and logged once (restart the agent to widen
the layout) rather than silently changing the store's shape.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

import numpy as np

from vigil.model import entity_kind
from vigil.sources.collect.base import Point, ProblemLog
from vigil.store.metrics import MetricFrame, MetricStore
from vigil.store.retention import AggregateTier, RetentionJob, RetentionPolicy, RetentionReport

log = logging.getLogger("vigil.agent")


class AgentStore:
    def __init__(
        self,
        path: Path,
        policy: RetentionPolicy | None = None,
        retention_every_s: float = 3600.0,
        flush_every_s: float = 60.0,
    ) -> None:
        self.path = path
        self.job = RetentionJob(MetricStore(path / "raw"), AggregateTier(path / "aggregates"), policy)
        self.retention_every_s = retention_every_s
        self.flush_every_s = flush_every_s
        self.problems = ProblemLog("store")
        self._layouts: dict[str, tuple[list[str], list[str]]] = {
            family: (self.job.raw.entities(family), self.job.raw.metrics(family)) for family in self.job.raw.families()
        }
        self._next_retention = 0.0
        self._next_flush = 0.0
        self.last_report: RetentionReport | None = None

    def record(self, ts: float, points: list[Point]) -> int:
        """Append one frame per family from the latest points; returns the number of values stored."""
        by_family: dict[str, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
        for point in points:
            # Series split by an extra label (xid, condition) are summed: the store keeps entity x metric.
            by_family[entity_kind(point.entity)][(point.entity, point.metric)] += point.value
        stored = 0
        for family, values in sorted(by_family.items()):
            layout = self._layouts.get(family)
            if layout is None:
                layout = (sorted({e for e, _ in values}), sorted({m for _, m in values}))
                self._layouts[family] = layout
            entities, metrics = layout
            row = {e: i for i, e in enumerate(entities)}
            column = {m: j for j, m in enumerate(metrics)}
            matrix = np.full((len(entities), len(metrics)), np.nan, dtype=np.float32)
            for (entity, metric), value in values.items():
                if entity in row and metric in column:
                    matrix[row[entity], column[metric]] = value
                    stored += 1
                else:
                    self.problems.report(
                        "outside the store layout", f"{metric} of {entity} appeared after the {family} layout was fixed"
                    )
            last = self.job.raw.window(family, 1)[0] if family in self.job.raw.families() else np.empty(0)
            if len(last) and ts <= last[-1]:
                continue
            self.job.raw.append(MetricFrame(ts, family, entities, metrics, matrix))
        return stored

    def maintain(self, now: float, mono: float) -> None:
        """Flush and run the retention job when they are due."""
        if mono >= self._next_retention:
            self._next_retention = mono + self.retention_every_s
            self.last_report = self.job.run(now)
            if self.last_report.buckets_aggregated or self.last_report.raw_frames_expired:
                log.info(
                    "retention: %d buckets aggregated, %d raw frames and %d segments expired",
                    self.last_report.buckets_aggregated,
                    self.last_report.raw_frames_expired,
                    self.last_report.segments_expired,
                )
        if mono >= self._next_flush:
            self._next_flush = mono + self.flush_every_s
            self.job.raw.flush()

    def close(self) -> None:
        self.job.raw.flush()
