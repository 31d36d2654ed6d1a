"""Analysis tools over the store that do the numbers for an agent: a job's events, incidents on an entity, what
changed before an incident, an incident's whitelisted plan, the on-call summary, a metric before and after a
moment, two jobs side by side, the metrics that moved most at an incident's start compared with their peers, and
the memory of past incidents (similar ones and what fixed them). Served by ``vigil mcp`` and
called by ``vigil ask``; each returns a pydantic model."""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from vigil.diagnose.memory import MemoryIndex, recall, remember_resolved
from vigil.faces.api.context import STEP_TIME, ServeContext
from vigil.faces.api.responses import IncidentList, IncidentSummary
from vigil.knowledge.actions import action_whitelist
from vigil.model import FaultLevel, Incident, Job, SimilarIncident, VigilInputError, covers, parse_entity

MAX_ROWS = 50
THROUGHPUT = "vigil_job_tokens_per_second"


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


class JobWindow(BaseModel):
    """One job over a window: its size, where it runs, its step time and throughput, the incidents on it."""

    job: str
    world_size: int
    gpus: int
    nodes: list[str]
    step_time_s: WindowStats
    tokens_per_second: WindowStats
    incidents_total: int
    incident_ids: list[str]


class JobComparison(BaseModel):
    """Job ``a`` beside job ``b`` over the same window (``since``/``until`` None: everything stored); when no
    ``b`` was named, the stored job of the closest world size is the peer (``peer_chosen``)."""

    since: float | None
    until: float | None
    a: JobWindow
    b: JobWindow | None
    peer_chosen: bool
    shared_nodes: list[str]
    step_time_ratio: float | None
    throughput_change_pct: float | None


class MetricMove(BaseModel):
    """How far one entity's metric moved at a moment (mean after minus mean before) beside the same metric on
    its peers: ``robust_z`` is the distance from the peers' median move in robust standard deviations (None
    when every peer stayed exactly flat)."""

    entity: str
    metric: str
    before_mean: float
    after_mean: float
    shift: float
    peers: int
    peer_median_shift: float
    robust_z: float | None


class IncidentCorrelation(BaseModel):
    """The metrics on an incident's entities ranked by how much more they moved around its start than the same
    metrics on peer entities (same family, not in the incident)."""

    incident_id: str
    incident_start: float
    window_s: float
    entities: list[str]
    without_peers: list[str]
    series_compared: int
    ranked: list[MetricMove]


def _window_stats(values: np.ndarray) -> WindowStats:
    finite = values[np.isfinite(values)]
    if not len(finite):
        return WindowStats(points=0, mean=None, min=None, max=None)
    return WindowStats(points=int(len(finite)), mean=round(float(finite.mean()), 6),
                       min=round(float(finite.min()), 6), max=round(float(finite.max()), 6))


def _mean_over_time(values: np.ndarray) -> np.ndarray:
    """values[t, entities, metrics] -> the mean over t, NaN where a series has no finite point."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(values, axis=0) if len(values) else np.full(values.shape[1:], np.nan)


def _robust_scale(peer_shifts: np.ndarray, peer_before: np.ndarray) -> float:
    """1.4826 x MAD of the peers' moves; when that is 0 (most peers moved alike), the peers' own noise before
    the moment, so one entity moving among flat peers still ranks."""
    mad = float(np.median(np.abs(peer_shifts - np.median(peer_shifts)))) * 1.4826
    if mad > 0:
        return mad
    finite = peer_before[np.isfinite(peer_before)]
    return float(finite.std()) if len(finite) else 0.0


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


def _job_nodes(job: Job) -> list[str]:
    return sorted({f"node/{parse_entity(g)[1][0]}" for g in job.placement})


class Analysis:
    """The analysis tools over one ServeContext (each method is one tool)."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx

    def tools(self) -> list[Any]:
        return [self.job_events, self.incidents_touching, self.changes_before, self.incident_plan,
                self.oncall_summary, self.metric_shift, self.compare_jobs, self.correlate_incident,
                self.similar_incidents, self.search_memory]

    def _incident(self, incident_id: str) -> Incident:
        incident = self.ctx.store.incident(incident_id)
        if incident is None:
            raise VigilInputError(f"no incident {incident_id!r}; `vigil incidents` lists them")
        return incident

    def _job(self, job_id: str) -> Job:
        name = job_id.removeprefix("job/")
        job = next((j for j in self.ctx.topology().jobs if j.id == name), None)
        if job is None:
            raise VigilInputError(f"no job {job_id!r}; known jobs: "
                                  f"{', '.join(j.id for j in self.ctx.topology().jobs[:20])}")
        return job

    def job_events(self, job_id: str) -> JobEvents:
        """A job's recorded events (started, stopped, restarted, exit reasons), oldest first."""
        job = self._job(job_id)
        events = sorted(self.ctx.store.events(entity=job.entity, limit=100_000), key=lambda e: e.ts)
        items = [_event_item(e) for e in events]
        nodes = _job_nodes(job)
        return JobEvents(job=job.id, world_size=job.world_size, nodes=nodes, events_total=len(items),
                         events=items[-MAX_ROWS:], last_event=items[-1] if items else None)

    def incidents_touching(self, entity: str) -> IncidentList:
        """Incidents (any status, newest first) whose entities lie on ``entity`` (a node covers its GPUs and
        NICs, a job its ranks)."""
        parse_entity(entity)
        found = [incident_summary(incident) for incident in self.ctx.store.incidents(limit=10_000)
                 if any(covers(entity, e) for e in (incident.scope, *incident.entities))]
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

    def _job_window(self, job: Job, since: float | None, until: float | None) -> JobWindow:
        def stats(metric: str) -> WindowStats:
            try:
                _, values = self.ctx.series(job.entity, metric, since, until)
            except VigilInputError:  # a job that never reported the metric
                values = np.empty(0)
            return _window_stats(values)

        nodes = _job_nodes(job)
        lo, hi = -np.inf if since is None else since, np.inf if until is None else until
        ids = sorted({i.id for entity in [job.entity, *nodes] for i in self.incidents_touching(entity).incidents
                      if lo <= i.start <= hi})
        return JobWindow(job=job.id, world_size=job.world_size,
                         gpus=sum(1 for g in job.placement if g.startswith("gpu/")), nodes=nodes,
                         step_time_s=stats(STEP_TIME), tokens_per_second=stats(THROUGHPUT),
                         incidents_total=len(ids), incident_ids=ids[:MAX_ROWS])

    def compare_jobs(self, job_a: str, job_b: str = "", since: float | None = None,
                     until: float | None = None) -> JobComparison:
        """Two jobs side by side over one window (Unix times; omitted: everything stored): world size, GPUs,
        nodes, step time and tokens/s (points, mean, min, max), incidents; the step-time ratio a/b and the
        throughput change of a against b in percent. Without job_b, the stored job of the closest world size."""
        a = self._job(job_a)
        if since is not None and until is not None and since >= until:
            raise VigilInputError(f"since ({since}) must be before until ({until})")
        if job_b:
            b: Job | None = self._job(job_b)
        else:
            others = [j for j in self.ctx.topology().jobs if j.id != a.id]
            b = min(others, key=lambda j: (abs(j.world_size - a.world_size), j.id), default=None)
        window_a = self._job_window(a, since, until)
        window_b = self._job_window(b, since, until) if b is not None else None
        ratio = change = None
        if window_b is not None:
            step_a, step_b = window_a.step_time_s.mean, window_b.step_time_s.mean
            ratio = round(step_a / step_b, 4) if step_a is not None and step_b else None
            tps_a, tps_b = window_a.tokens_per_second.mean, window_b.tokens_per_second.mean
            change = round(100.0 * (tps_a - tps_b) / abs(tps_b), 2) if tps_a is not None and tps_b else None
        return JobComparison(since=since, until=until, a=window_a, b=window_b, peer_chosen=not job_b and b is not None,
                             shared_nodes=sorted(set(window_a.nodes) & set(window_b.nodes if window_b else [])),
                             step_time_ratio=ratio, throughput_change_pct=change)

    def correlate_incident(self, incident_id: str, window_s: float = 600.0, k: int = 5) -> IncidentCorrelation:
        """Which metrics on the incident's entities moved most around its start: for each entity and metric, the
        mean in the ``window_s`` after minus the mean before, set against the same move on every peer entity
        (same kind, not in the incident) as a robust z-score; the top ``k``, largest first."""
        incident = self._incident(incident_id)
        window_s, k = float(window_s), max(1, min(int(k), MAX_ROWS))
        if not 0 < window_s <= 7 * 86400:
            raise VigilInputError(f"window_s must be in (0, 604800] seconds, not {window_s}")
        store = self.ctx.metrics
        if store is None:
            raise VigilInputError("correlate_incident reads Vigil's own metric store; none is configured")
        entities = list(dict.fromkeys([incident.scope, *incident.entities]))
        by_family: dict[str, list[str]] = {}
        for entity in entities:
            family = store.family_of(entity)
            if family is not None:
                by_family.setdefault(family, []).append(entity)
        moves: list[tuple[float, float, MetricMove]] = []
        without_peers: list[str] = []
        start = incident.start
        for family, members in sorted(by_family.items()):
            names, metrics = store.entities(family), store.metrics(family)
            peers = [i for i, e in enumerate(names) if e not in members]
            if not peers:
                without_peers.extend(members)
                continue
            ts, values = store.between(family, start - window_s, start + window_s)
            before, after = values[ts < start], values[ts >= start]
            mean_before, mean_after = _mean_over_time(before), _mean_over_time(after)
            shift = mean_after - mean_before
            for entity in members:
                row = names.index(entity)
                for m, metric in enumerate(metrics):
                    peer_shifts = shift[peers, m][np.isfinite(shift[peers, m])]
                    if not np.isfinite(shift[row, m]) or not len(peer_shifts):
                        continue
                    median = float(np.median(peer_shifts))
                    distance = float(shift[row, m]) - median
                    scale = _robust_scale(peer_shifts, before[:, peers, m])
                    z = distance / scale if scale > 0 else None
                    # a move among peers that stayed exactly flat is further out than any finite z
                    key = abs(z) if z is not None else (np.inf if distance else 0.0)
                    moves.append((key, abs(distance), MetricMove(
                        entity=entity, metric=metric, before_mean=round(float(mean_before[row, m]), 6),
                        after_mean=round(float(mean_after[row, m]), 6), shift=round(float(shift[row, m]), 6),
                        peers=len(peer_shifts), peer_median_shift=round(median, 6),
                        robust_z=round(z, 3) if z is not None else None)))
        moves.sort(key=lambda item: (-item[0], -item[1], item[2].entity, item[2].metric))
        return IncidentCorrelation(incident_id=incident.id, incident_start=start, window_s=window_s,
                                   entities=entities, without_peers=without_peers, series_compared=len(moves),
                                   ranked=[move for _, _, move in moves[:k]])

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
