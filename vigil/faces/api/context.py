"""What the server works from, and the read models that the REST API, the dashboard and MCP share."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from sqlalchemy import Text, cast, select

from vigil.config import Settings
from vigil.detect.waste import WasteReport, gpu_waste, window_of
from vigil.faces.api.auth import Authenticator
from vigil.faces.api.diagnosing import DiagnosisStatus, DiagnosisWorker, diagnosis_status
from vigil.faces.api.exporter import VigilCollector
from vigil.faces.api.hang import find_reports
from vigil.model import Diagnosis, Event, FaultLevel, Topology, VigilConflictError, VigilInputError
from vigil.remedy.lifecycle import LifecycleStore
from vigil.sources.promql import PromQLSource
from vigil.store import schema as tables
from vigil.store.metrics import MetricStore

if TYPE_CHECKING:
    from vigil.remedy.remediator import Remediator
    from vigil.store.sql import Store

STEP_TIME = "vigil_job_step_time_seconds"


class MetricsSource(Protocol):
    def series(
        self, entity: str, metric: str, start: float | None = None, end: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class _Snapshot:
    taken: float
    cursor: str
    topology: Topology
    grid: list[dict[str, Any]]


def change_cursor(store: Store) -> tuple[str, str]:
    """(topology digest, change cursor): digests of the stored topology and of every incident's id, status,
    level and end. Cheap (milliseconds at 10,000 GPUs), so readers can ask it instead of re-reading the store;
    it moves whoever writes (the engine, the API, a batch pipeline)."""
    with store.engine.connect() as conn:
        raw = conn.execute(select(cast(tables.topology.c.body, Text)).where(tables.topology.c.id == 1)).scalar()
        rows = conn.execute(
            select(
                tables.incidents.c.id, tables.incidents.c.status, tables.incidents.c.level, tables.incidents.c.end
            ).order_by(tables.incidents.c.id)
        ).all()
    topology_digest = hashlib.blake2b((raw or "").encode(), digest_size=8).hexdigest()
    digest = hashlib.blake2b(topology_digest.encode(), digest_size=8)
    for row in rows:
        digest.update(f"{row.id}|{row.status}|{row.level}|{row.end!r};".encode())
    return topology_digest, digest.hexdigest()


def _grid(topology: Topology, health: dict[str, FaultLevel]) -> list[dict[str, Any]]:
    rows = []
    for node in topology.nodes:
        gpus: list[dict[str, Any]] = []
        for gpu in node.gpus:
            entity = f"gpu/{node.name}/{gpu.index}"
            gpus.append({"id": entity, "index": gpu.index, "model": gpu.model, "level": int(health.get(entity, 0))})
        own = int(health.get(f"node/{node.name}", 0))
        rows.append(
            {
                "name": node.name,
                "id": f"node/{node.name}",
                "rack": node.rack,
                "switch": node.switch,
                "node_level": own,
                "level": max([own, *(g["level"] for g in gpus)]),
                "gpus": gpus,
            }
        )
    return rows


@dataclass
class ServeContext:
    store: Store
    settings: Settings
    metrics: MetricStore | None = None
    prom: PromQLSource | None = None
    launch_dirs: list[Path] = field(default_factory=list)
    lifecycle: LifecycleStore | None = None
    # the remediator of the configured back end (dry-run while execute_actions is off), None for backend none:
    # what approved actions run through (vigil.faces.api.actions), and the engine of `vigil serve` too
    remediator: Remediator | None = None
    backend: str = "none"
    collector: VigilCollector = field(init=False)
    auth: Authenticator = field(init=False)
    # Actions are read-modify-write (approve, execute); one lock keeps two approvals from racing.
    action_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    cache_ttl_s: float = 1.0
    _cache: _Snapshot | None = field(default=None, init=False)
    _cache_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # GPU waste reads every allocated GPU's series: computed at most every waste_ttl_s, over the last
    # waste_window_s of stored metrics.
    waste_ttl_s: float = 30.0
    waste_window_s: float = 900.0
    _waste: tuple[float, WasteReport | None] | None = field(default=None, init=False)
    _waste_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _waste_refreshing: bool = field(default=False, init=False)
    _kg: tuple[Topology, Any] | None = field(default=None, init=False)
    _kg_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    # Incidents stored without a diagnosis are diagnosed by these threads, never inside a request.
    diagnoser: DiagnosisWorker = field(init=False)

    def __post_init__(self) -> None:
        self.auth = Authenticator(self.settings)
        self.diagnoser = DiagnosisWorker(self.store, self.compute_diagnosis,
                                         threads=self.settings.serve_diagnosis_threads,
                                         lease_s=self.settings.serve_diagnosis_lease_s,
                                         retries=self.settings.serve_diagnosis_retries,
                                         retry_s=self.settings.serve_diagnosis_retry_s)
        topology = self.store.topology()
        self.collector = VigilCollector(
            self.store, self.node_grid, cluster=topology.cluster if topology else "vigil", waste=self.waste
        )

    # ------------------------------------------------------------------ metrics

    @property
    def auth_configured(self) -> bool:
        return self.auth.configured

    def metric_source(self) -> MetricsSource | None:
        return self.prom if self.prom is not None else self.metrics

    def series(
        self, entity: str, metric: str, start: float | None = None, end: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        source = self.metric_source()
        if source is None:
            raise VigilInputError("no metrics source: start the server with a metric store or VIGIL_METRICS_URL")
        return source.series(entity, metric, start, end)

    # ------------------------------------------------------------------ views

    def _snapshot(self) -> _Snapshot:
        """Topology and heat map, rebuilt only when the change cursor moved (looked at most every
        ``cache_ttl_s``): the dashboard and agents poll them far more often than they change, and both cost a
        full topology parse. Local writes invalidate."""
        with self._cache_lock:
            now = time.monotonic()
            if self._cache is not None and now - self._cache.taken < self.cache_ttl_s:
                return self._cache
            cursor = change_cursor(self.store)[1]
            if self._cache is not None and self._cache.cursor == cursor:
                self._cache.taken = now
                return self._cache
            topology = self.store.topology() or Topology()
            health = self.store.node_health()
            self._cache = _Snapshot(now, cursor, topology, _grid(topology, health))
            return self._cache

    def invalidate(self) -> None:
        with self._cache_lock:
            self._cache = None

    def topology(self) -> Topology:
        return self._snapshot().topology

    def node_grid(self) -> list[dict[str, Any]]:
        """Nodes x GPUs with the worst open fault level of each (the heat map)."""
        return self._snapshot().grid

    def waste(self) -> WasteReport | None:
        """Allocated vs used GPUs per job and node over the last ``waste_window_s`` of the embedded metric
        store (None without one, or without jobs or GPU metrics). Once computed, a stale report is answered
        while a thread computes the next (about 2 s at 10,000 GPUs), so no page or scrape waits for it."""
        with self._waste_lock:
            cached = self._waste
            if cached is None:
                self._waste = cached = (time.monotonic(), self._compute_waste())
            elif time.monotonic() - cached[0] >= self.waste_ttl_s and not self._waste_refreshing:
                self._waste_refreshing = True
                threading.Thread(target=self._refresh_waste, name="vigil-waste", daemon=True).start()
            return cached[1]

    def _refresh_waste(self) -> None:
        try:
            report = self._compute_waste()
            with self._waste_lock:
                self._waste = (time.monotonic(), report)
        finally:
            self._waste_refreshing = False

    def _compute_waste(self) -> WasteReport | None:
        topology = self.topology()
        span = window_of(self.metrics) if self.metrics is not None and topology.jobs else None
        if self.metrics is None or span is None:
            return None
        start, end = max(span[0], span[1] - self.waste_window_s), span[1]
        return gpu_waste(self.metrics, topology, start, max(end, start + 1.0))

    def job_step_times(self, job: str, last: int = 240) -> dict[str, Any]:
        """Per-rank step times of a job: from rank entities when the source has them, else the job's own."""
        topology = self.topology()
        spec = next((j for j in topology.jobs if j.id == job), None)
        if spec is None:
            raise KeyError(job)
        ranks: dict[int, dict[str, list[Any]]] = {}
        for rank in range(spec.world_size):
            ts, values = self._try_series(f"job/{job}/rank/{rank}", STEP_TIME)
            if len(ts):
                ranks[rank] = {"ts": ts[-last:].tolist(), "values": _clean(values[-last:])}
        job_ts, job_values = self._try_series(f"job/{job}", STEP_TIME)
        return {
            "job": spec.model_dump(),
            "ranks": ranks,
            "job_series": {"ts": job_ts[-last:].tolist(), "values": _clean(job_values[-last:])},
        }

    def _try_series(self, entity: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self.series(entity, metric)
        except VigilInputError:
            return np.empty(0), np.empty(0)

    def node_lifecycle(self, name: str) -> dict[str, Any]:
        """A node's lifecycle (healthy -> suspect -> cordoned -> draining -> repairing -> self_check -> back)
        as the remediator recorded it (vigil/remedy/lifecycle.py), with its recent events and actions."""
        topology = self.topology()
        try:
            node = topology.node(name)
        except KeyError:
            raise KeyError(name) from None
        node_entities = {node.id, *(g.id for g in node.gpus), *(n.id for n in node.nics)}
        actions = sorted((a for a in self.store.actions(limit=100000) if a.target in node_entities), key=lambda a: a.ts)
        events = self.store.events(entity=node.id, limit=500)
        for gpu in node.gpus:
            events.extend(self.store.events(entity=gpu.id, limit=200))
        events.sort(key=lambda e: e.ts)
        # The snapshot's row folds the node's GPUs and NICs into its level, as the store's node_health does.
        level = next((row["level"] for row in self.node_grid() if row["name"] == name), 0)
        state, since, reason, steps = "healthy", 0.0, "", []
        if self.lifecycle is not None:
            status = self.lifecycle.status(node.id)
            state, since, reason = status.state.value, status.since, status.reason
            steps = [
                {
                    "ts": t.ts,
                    "from": t.from_state.value,
                    "stage": t.to_state.value,
                    "trigger": t.trigger.value,
                    "detail": t.reason,
                }
                for t in self.lifecycle.history(node.id)
            ]
        return {
            "node": node.model_dump(),
            "level": level,
            "stage": state,
            "since": since,
            "reason": reason,
            "steps": steps,
            "events": [e.model_dump() for e in events[-100:]],
            "actions": [a.model_dump() for a in actions],
        }

    def diagnose(self, incident_id: str) -> Diagnosis:
        """Diagnose the incident again now, in this call, and store the result (`vigil diagnose`, the assistant's
        tools; the API's POST .../diagnose runs it on a thread: ``diagnose_later``): claimed in the store like a
        background diagnosis, so it does not run beside one already running (VigilConflictError)."""
        if self.store.incident(incident_id) is None:
            raise KeyError(incident_id)
        found = self.diagnoser.run(incident_id, again=True)
        if found is None:  # the claim lapsed while it ran and another server took it over: theirs is stored
            stored = self.store.diagnosis(incident_id)
            if stored is None:
                raise VigilConflictError(f"incident {incident_id!r} is being diagnosed by another server now")
            return stored
        return found

    def diagnose_later(self, incident_id: str) -> DiagnosisStatus:
        """*Diagnose again* from a page or the API: the rerun claimed now (VigilConflictError while one runs) and
        run on a thread of its own; how it stands, at once (``diagnosis_status`` tells when it is done)."""
        if self.store.incident(incident_id) is None:
            raise KeyError(incident_id)
        self.diagnoser.rerun(incident_id)
        return self.diagnosis_status(incident_id)

    def diagnosis_status(self, incident_id: str) -> DiagnosisStatus:
        return diagnosis_status(self.store, self.diagnoser, incident_id)

    def compute_diagnosis(self, incident_id: str) -> Diagnosis:
        """Rank the incident's root causes (vigil/diagnose: knowledge graph walk, then the LLM if one is
        configured, else the deterministic plan); the caller stores the result (``DiagnosisWorker``)."""
        from vigil.diagnose.kg import KnowledgeGraph
        from vigil.diagnose.llm import LlmClient, diagnose
        from vigil.diagnose.memory import recall
        from vigil.diagnose.rca import analyze_incident, record_entities

        incident = self.store.incident(incident_id)
        if incident is None:
            raise KeyError(incident_id)
        topology = self.topology()
        if not topology.nodes:
            raise VigilInputError("the store holds no topology to reason over; run `vigil demo` or a collector")
        with self._kg_lock:
            # The graph is rebuilt only when the topology changed (seconds on 10,000 GPUs).
            if self._kg is None or self._kg[0] != topology:
                self._kg = (topology, KnowledgeGraph.build(topology))
            kg = self._kg[1]
        slack = 900.0  # the records around the incident that the ranking may cite
        anomalies = self.store.anomalies(since=incident.start - slack, limit=100_000, ids=incident.anomalies)
        # Only the records of the incident's footprint are read, selected in the database by entity: the ranking
        # keeps no other (select_records), and the window holds tens of thousands across the cluster (88,600
        # events on 10,000 GPUs).
        own = [a for a in anomalies if not incident.anomalies or a.id in incident.anomalies]
        entities = record_entities(kg, incident, own)
        events = self.store.events(since=incident.start - slack, until=incident.end + slack, limit=100_000,
                                   entities=entities)
        logs = self.store.logs(since=incident.start - slack, until=incident.end + slack, limit=100_000,
                               entities=entities)
        result = analyze_incident(kg, incident, anomalies, events, logs)
        found = diagnose(kg, incident, result, LlmClient.from_settings(self.settings))
        found.similar = recall(self.store, incident, found)
        return found

    def hang_reports(self) -> dict[str, Path]:
        return find_reports(self.launch_dirs)

    def search_events(self, text: str, entity: str | None = None, limit: int = 50) -> list[Event]:
        needle = text.lower()
        return [
            e
            for e in self.store.events(entity=entity, limit=100000)
            if needle in e.message.lower() or needle in e.kind.lower()
        ][:limit]


def _clean(values: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in values]
