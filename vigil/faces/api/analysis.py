"""Analysis tools over the store that do the numbers for an agent: a job's events, incidents on an entity, what
changed before an incident, an incident's whitelisted plan, the on-call summary, a metric before and after a
moment, and the memory of past incidents (similar ones and what fixed them). Served by ``vigil mcp`` and
called by ``vigil ask``; each returns a pydantic model."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from vigil.diagnose.memory import MemoryIndex, recall, remember_resolved
from vigil.faces.api.context import ServeContext
from vigil.faces.api.responses import IncidentList, IncidentSummary
from vigil.knowledge.actions import action_whitelist
from vigil.model import FaultLevel, Incident, SimilarIncident, VigilInputError, parse_entity

MAX_ROWS = 50


class EventItem(BaseModel):
    ts: float
    entity: str
    kind: str
    source: str
    message: str
    reason: str = ""
    exit_reason: str = ""


class JobEvents(BaseModel):
    """A job's lifecycle as the launcher and collectors recorded it, oldest first."""

    job: str
    world_size: int
    nodes: list[str]
    events_total: int
    events: list[EventItem]
    last_event: EventItem | None


class CountItem(BaseModel):
    key: str
    count: int


class ChangesBefore(BaseModel):
    """What was recorded in the window before an incident started: events, anomalies and actions, with counts."""

    incident_id: str
    incident_start: float
    window_s: float
    events_total: int
    events: list[EventItem]
    events_by_kind: list[CountItem]
    anomalies_total: int
    anomalies_by_fault: list[CountItem]
    actions: list[str]


class PlanStep(BaseModel):
    action: str
    target: str
    command: str
    risk: str
    reason: str


class IncidentPlan(BaseModel):
    """The stored diagnosis' plan, each step's command rendered from the action whitelist."""

    incident_id: str
    diagnosed: bool
    summary: str = ""
    root_cause_entity: str = ""
    root_cause_fault: str = ""
    confidence: float | None = None
    steps: list[PlanStep] = Field(default_factory=list)
    steps_dropped: int = 0


class OncallSummary(BaseModel):
    """Incidents that started in the window ending at the newest stored incident."""

    window_end: float
    hours: float
    incidents_total: int
    open_total: int
    by_level: list[CountItem]
    top_fault_types: list[CountItem]
    top_entities: list[CountItem]
    worst: list[IncidentSummary]


class WindowStats(BaseModel):
    points: int
    mean: float | None
    min: float | None
    max: float | None


class MetricShift(BaseModel):
    """One entity's metric in the window before a moment and the window after it, and the change of the mean."""

    entity: str
    metric: str
    at: float
    window_s: float
    before: WindowStats
    after: WindowStats
    change_pct: float | None


def _window_stats(values: np.ndarray) -> WindowStats:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return WindowStats(points=0, mean=None, min=None, max=None)
    return WindowStats(points=int(len(finite)), mean=round(float(finite.mean()), 6),
                       min=round(float(finite.min()), 6), max=round(float(finite.max()), 6))


class SimilarIncidents(BaseModel):
    """Resolved incidents most like the given one (TF-IDF cosine over remembered summaries, only incidents that
    ended before it started), each with its root cause, what was done and the outcome."""

    incident_id: str
    remembered: int
    similar: list[SimilarIncident]


class MemorySearch(BaseModel):
    """Remembered (resolved) incidents most like a free-text description."""

    text: str
    remembered: int
    matches: list[SimilarIncident]


def incident_summary(incident: Incident) -> IncidentSummary:
    return IncidentSummary(
        id=incident.id,
        title=incident.title,
        level=incident.level,
        scope=incident.scope,
        fault_types=incident.fault_types,
        start=incident.start,
        end=incident.end,
        status=incident.status.value,
        entities=incident.entities[:20],
    )


def top_k(values: list[str], k: int = 5) -> list[CountItem]:
    """The ``k`` most frequent keys, ties broken by name so the order is stable."""
    counts = Counter(values)
    return [CountItem(key=key, count=n) for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def _event_item(event: Any) -> EventItem:
    return EventItem(ts=event.ts, entity=event.entity, kind=event.kind, source=event.source,
                     message=event.message[:500], reason=str(event.attrs.get("reason", "")),
                     exit_reason=str(event.attrs.get("exit_reason", "")))


class Analysis:
    """The analysis tools over one ServeContext (each method is one tool)."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx

    def tools(self) -> list[Any]:
        return [self.job_events, self.incidents_touching, self.changes_before, self.incident_plan,
                self.oncall_summary, self.metric_shift, self.similar_incidents, self.search_memory]

    def _incident(self, incident_id: str) -> Incident:
        incident = self.ctx.store.incident(incident_id)
        if incident is None:
            raise VigilInputError(f"no incident {incident_id!r}; `vigil incidents` lists them")
        return incident

    def job_events(self, job_id: str) -> JobEvents:
        """A job's recorded events (started, stopped, restarted, exit reasons), oldest first."""
        name = job_id.removeprefix("job/")
        job = next((j for j in self.ctx.topology().jobs if j.id == name), None)
        if job is None:
            raise VigilInputError(f"no job {job_id!r}; known jobs: "
                                  f"{', '.join(j.id for j in self.ctx.topology().jobs[:20])}")
        events = sorted(self.ctx.store.events(entity=job.entity, limit=100_000), key=lambda e: e.ts)
        items = [_event_item(e) for e in events]
        nodes = sorted({f"node/{parse_entity(g)[1][0]}" for g in job.placement})
        return JobEvents(job=job.id, world_size=job.world_size, nodes=nodes, events_total=len(items),
                         events=items[-MAX_ROWS:], last_event=items[-1] if items else None)

    def incidents_touching(self, entity: str) -> IncidentList:
        """Incidents (any status, newest first) whose entities lie on ``entity`` (a node covers its GPUs, NICs)."""
        kind, _ = parse_entity(entity)
        found = []
        for incident in self.ctx.store.incidents(limit=10_000):
            touched = {incident.scope, *incident.entities}
            if entity in touched or (kind == "node" and any(
                    e.startswith(f"{k}/{entity.removeprefix('node/')}/") for e in touched for k in ("gpu", "nic"))):
                found.append(incident_summary(incident))
        return IncidentList(count=len(found), incidents=found[:MAX_ROWS])

    def changes_before(self, incident_id: str, window_s: float = 900.0) -> ChangesBefore:
        """Events, anomalies and actions recorded in the ``window_s`` seconds before the incident started."""
        incident = self._incident(incident_id)
        if not 0 < window_s <= 7 * 86400:
            raise VigilInputError(f"window_s must be in (0, 604800] seconds, not {window_s}")
        since = incident.start - window_s
        events = sorted((e for e in self.ctx.store.events(since=since, until=incident.start, limit=100_000)),
                        key=lambda e: e.ts)
        anomalies = [a for a in self.ctx.store.anomalies(since=since, limit=100_000) if a.start <= incident.start]
        actions = [f"{a.kind.value} {a.target} ({a.status.value})" for a in self.ctx.store.actions(limit=10_000)
                   if since <= a.ts <= incident.start]
        return ChangesBefore(
            incident_id=incident.id, incident_start=incident.start, window_s=window_s, events_total=len(events),
            events=[_event_item(e) for e in events[-MAX_ROWS:]], events_by_kind=top_k([e.kind for e in events]),
            anomalies_total=len(anomalies), anomalies_by_fault=top_k([a.fault_type for a in anomalies]),
            actions=actions[:MAX_ROWS])

    def incident_plan(self, incident_id: str) -> IncidentPlan:
        """The stored diagnosis of an incident and its plan; only whitelisted actions, commands from the whitelist."""
        incident = self._incident(incident_id)
        diagnosis = self.ctx.store.diagnosis(incident.id)
        if diagnosis is None:
            return IncidentPlan(incident_id=incident.id, diagnosed=False)
        whitelist = action_whitelist()
        steps = [PlanStep(action=s.action.value, target=s.target, command=s.command, risk=s.risk, reason=s.reason)
                 for s in diagnosis.plan if s.action in whitelist]
        root = diagnosis.root_cause
        return IncidentPlan(incident_id=incident.id, diagnosed=True, summary=diagnosis.summary,
                            root_cause_entity=root.entity if root else "",
                            root_cause_fault=root.fault_type if root else "", confidence=diagnosis.confidence,
                            steps=steps, steps_dropped=len(diagnosis.plan) - len(steps))

    def oncall_summary(self, hours: float = 24.0) -> OncallSummary:
        """Incidents of the last ``hours`` up to the newest stored incident: counts by level, top fault types and
        entities, the worst five."""
        if not 0 < hours <= 24 * 31:
            raise VigilInputError(f"hours must be in (0, 744], not {hours}")
        incidents = self.ctx.store.incidents(limit=100_000)
        # The window ends at the store's newest record, not the wall clock, so replayed or old data summarizes too.
        end = max((max(i.start, i.end or i.start) for i in incidents), default=0.0)
        window = [i for i in incidents if end - hours * 3600 <= i.start <= end]
        worst = sorted(window, key=lambda i: (-int(i.level), -i.start))[:5]
        return OncallSummary(
            window_end=end, hours=hours, incidents_total=len(window),
            open_total=sum(1 for i in window if i.status.value == "open"),
            by_level=top_k([FaultLevel(i.level).label for i in window], k=5),
            top_fault_types=top_k([f for i in window for f in i.fault_types]),
            top_entities=top_k([i.scope for i in window]),
            worst=[incident_summary(i) for i in worst])

    def metric_shift(self, entity: str, metric: str, at: float, window_s: float = 600.0) -> MetricShift:
        """An entity's metric (e.g. job/j7, vigil_job_tokens_per_second) in the ``window_s`` before and after
        the Unix time ``at``: points, mean, min, max, and the change of the mean in percent."""
        parse_entity(entity)
        at, window_s = float(at), float(window_s)
        if not 0 < window_s <= 7 * 86400:
            raise VigilInputError(f"window_s must be in (0, 604800] seconds, not {window_s}")
        ts, values = self.ctx.series(entity, metric, at - window_s, at + window_s)
        before, after = _window_stats(values[ts < at]), _window_stats(values[ts >= at])
        change = (round(100.0 * (after.mean - before.mean) / abs(before.mean), 2)
                  if before.mean and after.mean is not None else None)
        return MetricShift(entity=entity, metric=metric, at=at, window_s=window_s, before=before, after=after,
                           change_pct=change)

    def similar_incidents(self, incident_id: str, k: int = 3) -> SimilarIncidents:
        """Past resolved incidents most like this one (remembered summaries, TF-IDF similarity 0..1), with
        their root cause, the actions taken and the outcome: what fixed it last time."""
        incident = self._incident(incident_id)
        k = max(1, min(int(k), 10))
        similar = recall(self.ctx.store, incident, self.ctx.store.diagnosis(incident.id), k=k)
        return SimilarIncidents(incident_id=incident.id, remembered=len(self.ctx.store.remembered_ids()),
                                similar=similar)

    def search_memory(self, text: str, k: int = 5) -> MemorySearch:
        """Remembered resolved incidents most like a description (e.g. "gpu_dbe job_crash", "NIC link flap"):
        root cause, actions taken, outcome."""
        if not text.strip():
            raise VigilInputError("search text is empty")
        remember_resolved(self.ctx.store)
        memories = self.ctx.store.memories()
        k = max(1, min(int(k), 20))
        return MemorySearch(text=text[:500], remembered=len(memories),
                            matches=MemoryIndex(memories).similar(text[:2000], k=k))
