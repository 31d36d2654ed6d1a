"""``/metrics``: Vigil's own state as Prometheus families, following the naming conventions.

Families carry the ``vigil_`` prefix, base units, ``_total`` only on counters, and few bounded labels
(``node``, ``gpu``, ``job``, ``level``, ``detector``): never an incident id, a message or a changing state, so
the series count stays at about one per GPU plus a handful.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from vigil import __version__
from vigil.detect.waste import WasteReport
from vigil.model import FaultLevel, IncidentStatus

DETECTOR_WINDOW_S = 3600.0


class VigilCollector(Collector):
    """Reads the store on every scrape; fault levels come from ``grid`` (the server's heat-map snapshot,
    at most a second old) so a scrape costs no extra topology parse."""

    def __init__(
        self,
        store: Any,
        grid: Callable[[], list[dict[str, Any]]],
        cluster: str = "vigil",
        waste: Callable[[], WasteReport | None] | None = None,
    ) -> None:
        self.store = store
        self.grid = grid
        self.cluster = cluster
        self.waste = waste
        # Alertmanager's alerts by status: each one once (its first notification), and the notifications of one
        # stored already (a repeat_interval repeat, a notification sent again after an answer was lost)
        self.alerts_received: Counter[str] = Counter()
        self.alerts_repeated: Counter[str] = Counter()

    def collect(self) -> Iterable[Any]:
        info = InfoMetricFamily("vigil_build", "Vigil version and cluster name.")
        info.add_metric([], {"version": __version__, "cluster": self.cluster})
        yield info

        gpu_level = GaugeMetricFamily(
            "vigil_gpu_fault_level",
            "Worst open fault level of a GPU: 0 healthy, 1 observe, 2 degraded, 3 drain, 4 isolate.",
            labels=["node", "gpu"],
        )
        node_level = GaugeMetricFamily(
            "vigil_node_fault_level",
            "Worst open fault level of a node or any of its GPUs: 0 healthy .. 4 isolate.",
            labels=["node"],
        )
        for row in self.grid():
            node_level.add_metric([row["name"]], row["level"])
            for gpu in row["gpus"]:
                gpu_level.add_metric([row["name"], str(gpu["index"])], gpu["level"])
        yield gpu_level
        yield node_level

        _, engine_state = self.store.cursor("engine")
        yield GaugeMetricFamily(
            "vigil_engine_last_tick_timestamp_seconds",
            "When the live engine last finished a round (0 before its first).",
            value=float(engine_state.get("at") or 0.0),
        )
        yield CounterMetricFamily(
            "vigil_engine_stale_pushes",
            "Metric pushes stamped more than live_push_max_age_s before the engine read them: stored, never judged "
            "live (a backlog after an outage, or a node whose clock is behind).",
            value=float(engine_state.get("stale_pushes") or 0),
        )
        yield CounterMetricFamily(
            "vigil_engine_late_pushes",
            "Metric pushes older than a value the engine's live view held of their series (that value kept).",
            value=float(engine_state.get("late_pushes") or 0),
        )
        offsets = GaugeMetricFamily(
            "vigil_engine_push_offset_seconds",
            "Per node: its newest metric push's stamp less the time the engine read it - its clock's lead over the "
            "server's less the push's delay (well below -live_push_max_age_s: the clock is behind).",
            labels=["node"],
        )
        for node, offset in sorted(dict(engine_state.get("push_offsets") or {}).items()):
            offsets.add_metric([str(node)], float(offset))
        yield offsets

        open_incidents = GaugeMetricFamily(
            "vigil_incidents_open", "Open (not resolved) incidents by fault level.", labels=["level"]
        )
        by_level: Counter[str] = Counter()
        for status in (IncidentStatus.OPEN, IncidentStatus.ACKNOWLEDGED):
            for incident in self.store.incidents(status=status, limit=100000):
                by_level[FaultLevel(incident.level).label] += 1
        for level in FaultLevel:
            if level is not FaultLevel.HEALTHY:
                open_incidents.add_metric([level.label], by_level[level.label])
        yield open_incidents

        score = GaugeMetricFamily(
            "vigil_detector_score_max",
            "Highest anomaly score per detector in the last hour of activity (up to the newest incident's end).",
            labels=["detector"],
        )
        anomaly_count = GaugeMetricFamily(
            "vigil_detector_anomalies",
            "Anomalies per detector in the last hour of activity (up to the newest incident's end).",
            labels=["detector"],
        )
        best: dict[str, float] = {}
        counts: Counter[str] = Counter()
        # Store time, not wall time: replayed or simulated data is as current as its newest incident.
        newest = self.store.incidents(limit=1)
        since = newest[0].end - DETECTOR_WINDOW_S if newest else None
        for anomaly in self.store.anomalies(since=since, limit=5000):
            best[anomaly.detector] = max(best.get(anomaly.detector, float("-inf")), anomaly.score)
            counts[anomaly.detector] += 1
        for detector in sorted(best):
            score.add_metric([detector], best[detector])
            anomaly_count.add_metric([detector], counts[detector])
        yield score
        yield anomaly_count

        yield from self._waste_families()

        alerts = CounterMetricFamily(
            "vigil_alertmanager_alerts", "Alerts received on the Alertmanager webhook, each one once.",
            labels=["status"],
        )
        repeats = CounterMetricFamily(
            "vigil_alertmanager_alert_repeats",
            "Notifications of an alert the Alertmanager webhook had stored already (repeat_interval, retries).",
            labels=["status"],
        )
        for alert_status in ("firing", "resolved"):
            alerts.add_metric([alert_status], self.alerts_received[alert_status])
            repeats.add_metric([alert_status], self.alerts_repeated[alert_status])
        yield alerts
        yield repeats


    def _waste_families(self) -> Iterable[Any]:
        """Allocated against used GPUs per job and per node (one series each: jobs and nodes are bounded)."""
        report = self.waste() if self.waste is not None else None
        if report is None:
            return
        for key in ("job", "node"):
            waste = GaugeMetricFamily(
                f"vigil_{key}_gpu_waste_ratio",
                f"1 - mean activity of the GPUs each {key} is allocated, over the last window of stored metrics "
                "(activity: DCGM graphics-engine active, else GPU utilization).",
                labels=[key],
            )
            allocated = GaugeMetricFamily(
                f"vigil_{key}_gpus_allocated", f"GPUs allocated to each {key} by the jobs' placement.", labels=[key]
            )
            idle = GaugeMetricFamily(
                f"vigil_{key}_gpus_idle",
                f"Allocated GPUs of each {key} idle for the whole window (nothing running: can be given back).",
                labels=[key],
            )
            for row in report.summary(key):
                if row.waste_rate is not None:
                    waste.add_metric([row.name], row.waste_rate)
                allocated.add_metric([row.name], row.allocated_gpus)
                idle.add_metric([row.name], len(row.idle_gpus))
            yield waste
            yield allocated
            yield idle


def render_metrics(collector: VigilCollector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)
