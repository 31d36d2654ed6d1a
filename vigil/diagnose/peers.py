"""Peer differences as RCA evidence: a GPU that sits far from the other GPUs of its own job.

Ranks of a data-parallel job do the same work, so their GPUs' throughput metrics agree; one GPU whose
NVLink bandwidth is a fraction of its job's median is the odd one out even when no threshold rule fires
(degraded links train down without errors), and one idle GPU among peers busy in a stalled collective is
the rank the others wait for. The detector compares each GPU with the median of its job's
busy GPUs every tick and opens an anomaly once the gap has held for ``hold_ticks`` ticks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vigil.detect.base import StreamDetector
from vigil.model import Anomaly, Event, Evidence, FaultLevel, Topology
from vigil.store.metrics import MetricFrame


@dataclass(frozen=True)
class PeerSignal:
    metric: str
    finding: str
    low_ratio: float  # below this share of the job median is an outlier
    floor: float  # job medians under this are idle / stalled jobs: nothing to compare


PEER_SIGNALS = (
    PeerSignal("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "peer_nvlink_bandwidth_low", 0.7, 1e3),
    # In a hang the peers spin in NCCL kernels at full utilization; the stuck rank's GPU sits idle.
    PeerSignal("DCGM_FI_DEV_GPU_UTIL", "peer_gpu_idle", 0.3, 50.0),
)


class PeerDifferenceDetector(StreamDetector):
    """GPUs far below their job's median on a throughput metric."""

    name = "peers"

    def __init__(self, topology: Topology, signals: Sequence[PeerSignal] = PEER_SIGNALS, hold_ticks: int = 3,
                 min_peers: int = 4) -> None:
        self.signals = tuple(signals)
        self.hold_ticks = hold_ticks
        self.min_peers = min_peers
        self._job_gpus = {job.entity: list(job.placement) for job in topology.jobs}
        self._streak: dict[tuple[str, str], int] = defaultdict(int)
        self._open: dict[tuple[str, str], Anomaly] = {}
        self.closed: list[Anomaly] = []

    def update(self, frames: Sequence[MetricFrame], events: Sequence[Event]) -> list[Anomaly]:
        frame = next((f for f in frames if f.family == "gpu"), None)
        if frame is None:
            return []
        position = {e: i for i, e in enumerate(frame.entities)}
        opened: list[Anomaly] = []
        seen: set[tuple[str, str]] = set()
        for signal in self.signals:
            if signal.metric not in frame.metrics:
                continue
            values = frame.column(signal.metric)
            for job, gpus in self._job_gpus.items():
                idx = np.array([position[g] for g in gpus if g in position], dtype=int)
                if len(idx) < self.min_peers:
                    continue
                job_values = values[idx]
                finite = np.isfinite(job_values)
                if finite.sum() < self.min_peers:
                    continue
                median = float(np.median(job_values[finite]))
                if median < signal.floor:
                    continue
                for i in idx[finite & (job_values < signal.low_ratio * median)]:
                    key = (frame.entities[i], signal.finding)
                    seen.add(key)
                    self._streak[key] += 1
                    if self._streak[key] < self.hold_ticks:
                        continue
                    summary = (f"{frame.entities[i]} {signal.metric}={values[i]:.4g} is "
                               f"{values[i] / median:.0%} of its job's median {median:.4g} ({job})")
                    anomaly = self._open.get(key)
                    if anomaly is None:
                        anomaly = Anomaly(entity=frame.entities[i], start=frame.ts, end=frame.ts,
                                          detector=self.name, fault_type=signal.finding, level=FaultLevel.DEGRADED,
                                          score=float(min(1.0, 1 - values[i] / median)),
                                          evidence=[Evidence(kind="peer", entity=frame.entities[i], ts=frame.ts,
                                                             summary=summary, metric=signal.metric,
                                                             value=float(values[i]),
                                                             attrs={"job": job, "median": median})])
                        self._open[key] = anomaly
                        opened.append(anomaly)
                    anomaly.end = frame.ts
        for key in [k for k in self._streak if k not in seen]:
            del self._streak[key]
            if key in self._open:
                self.closed.append(self._open.pop(key))
        return opened

    def close(self) -> list[Anomaly]:
        self.closed.extend(self._open.values())
        self._open.clear()
        return self.closed
