"""The whole flow on one machine: source -> store -> detect -> incidents (-> diagnose, remedy downstream).

Scoring against a simulated run's ground truth is evaluation, not the flow: ``vigil_eval.scoring`` does it on
the result."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vigil.detect.base import StreamDetector
from vigil.detect.incidents import IncidentGrouper
from vigil.detect.rules import RuleDetector
from vigil.model import Anomaly, Event, Incident, anomaly_id_for
from vigil.sources.collect.dcgm import XID_GAUGE, XidGaugeChanges
from vigil.sources.replay import KernelLineDecoder, decode_kube_events, decode_rank_lines
from vigil.sources.sim.generator import SimRun
from vigil.store.metrics import MetricStore
from vigil.store.sql import Store


@dataclass
class PipelineResult:
    anomalies: list[Anomaly]
    incidents: list[Incident]
    observations: list[Anomaly]
    events: list[Event]
    samples: int
    seconds: float
    metrics: MetricStore
    detectors: list[StreamDetector] = field(default_factory=list)


def run_pipeline(
    run: SimRun,
    store: Store | None = None,
    metrics: MetricStore | None = None,
    detectors: Sequence[StreamDetector] | None = None,
    progress: Callable[[int, int], None] | None = None,
    xid_from_gpu_gauge: bool = False,
    keep_events: bool = True,
) -> PipelineResult:
    """Feed a simulated run tick by tick through the store and the detectors, then group the anomalies.

    ``xid_from_gpu_gauge``: Xid events from dcgm-exporter's last-Xid gauge, as the agent reads them on nodes
    whose kernel log it cannot read (``vigil.sources.collect.agent``). ``keep_events=False`` leaves
    ``PipelineResult.events`` empty: every decoded rank-log line is an event (about 1.3 KB each; 108,000 of
    them in 30 minutes of 1,250 nodes), which a caller that reads only the incidents or the store need not hold."""
    metrics = metrics if metrics is not None else MetricStore()
    dets: list[StreamDetector] = list(detectors) if detectors is not None else [RuleDetector(run.topology)]
    grouper = IncidentGrouper(run.topology)
    if store is not None:
        store.save_topology(run.topology)
        store.add_logs(run.logs)
    samples = 0
    seen: list[Event] = []
    started = time.perf_counter()
    # the fake cluster hands over raw kernel lines, Kubernetes Event objects and the ranks' log lines; the
    # production decoders turn them into events
    kernel = KernelLineDecoder(run.topology)
    xid_gauge = XidGaugeChanges() if xid_from_gpu_gauge else None
    for k, tick in enumerate(run.ticks()):
        gauge_events: list[Event] = []
        for frame in tick.frames:
            metrics.append(frame)
            if xid_gauge is not None and XID_GAUGE in frame.metrics:
                column = frame.column(XID_GAUGE)
                readings = [(e, int(v)) for e, v in zip(frame.entities, column.tolist(), strict=True)
                            if math.isfinite(v)]  # a GPU off the bus reads nothing
                gauge_events += xid_gauge.changes(readings, frame.ts)
        samples += tick.sample_count
        events = sorted([*tick.events, *kernel.decode(tick.kernel_lines), *decode_kube_events(tick.kube_events),
                         *decode_rank_lines(tick.rank_lines), *gauge_events], key=lambda e: e.ts)
        if keep_events:
            seen.extend(events)
        if store is not None and events:
            store.add_events(events)
        for det in dets:
            opened = det.update(tick.frames, events)
            for anomaly in opened:
                # named by what it is about, as the live engine names them: the same seed, the same ids
                anomaly.id = anomaly_id_for(anomaly)
            grouper.add(opened)
        if progress is not None:
            progress(k + 1, run.n_ticks)
    anomalies: list[Anomaly] = []
    for det in dets:
        anomalies.extend(det.close())
    seconds = time.perf_counter() - started
    incidents = grouper.incidents(now=run.end_ts)
    if store is not None:
        store.add_anomalies(anomalies)
        for incident in incidents:
            store.upsert_incident(incident)
    metrics.flush()
    return PipelineResult(anomalies=anomalies, incidents=incidents, observations=grouper.observations, events=seen,
                          samples=samples, seconds=seconds, metrics=metrics, detectors=dets)
