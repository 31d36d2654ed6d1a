"""The tools `vigil ask` answers from: the MCP server's read tools, called through the SDK's own ``call_tool``,
plus a few that compute over the store (a job's events, what changed before an incident, an incident's
whitelisted plan, the on-call summary). Every tool returns a pydantic model; every scalar in it is a fact with
a stable citation id ``<call id>.<path>`` (``job.ranks_on_unhealthy_hardware.0.gpu``), so an answer can be
checked fact by fact against what the tools returned."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from vigil.faces.api.context import ServeContext
from vigil.faces.api.mcp_server import _incident_summary, build_mcp_server
from vigil.faces.api.responses import (
    HealthReport,
    IncidentDetail,
    IncidentList,
    IncidentSummary,
    JobHealth,
    LogSearch,
    MetricPoints,
    XidExplanation,
)
from vigil.knowledge.actions import action_whitelist
from vigil.model import FaultLevel, Incident, VigilInputError, parse_entity

# The MCP tools `vigil ask` may call, with the model each answers with.
MCP_TOOLS: dict[str, type[BaseModel]] = {
    "list_incidents": IncidentList,
    "get_incident": IncidentDetail,
    "node_health": HealthReport,
    "query_metrics": MetricPoints,
    "diagnose_job": JobHealth,
    "explain_xid": XidExplanation,
    "search_logs": LogSearch,
}
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


@dataclass
class ToolResult:
    """One call: its citation id, the tool, its arguments and the model it answered with."""

    id: str
    tool: str
    args: dict[str, Any]
    result: BaseModel

    def facts(self) -> dict[str, Any]:
        """Every scalar of the result under its citation id."""
        out: dict[str, Any] = {}
        _flatten(self.id, self.result.model_dump(mode="json"), out)
        return out

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "args": self.args, "result": self.result.model_dump(mode="json")}


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}", item, out)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _flatten(f"{prefix}.{index}", item, out)
    else:
        out[prefix] = value


def top_k(values: list[str], k: int = 5) -> list[CountItem]:
    """The ``k`` most frequent keys, ties broken by name so the order is stable."""
    counts = Counter(values)
    return [CountItem(key=key, count=n) for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def _event_item(event: Any) -> EventItem:
    return EventItem(ts=event.ts, entity=event.entity, kind=event.kind, source=event.source,
                     message=event.message[:500], reason=str(event.attrs.get("reason", "")),
                     exit_reason=str(event.attrs.get("exit_reason", "")))


class Toolbox:
    """The read tools over one ServeContext; ``call`` runs one by name and validates its arguments."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx
        self._mcp: MCPServer = build_mcp_server(ctx)
        self._own: dict[str, Callable[..., BaseModel]] = {
            "job_events": self.job_events,
            "incidents_touching": self.incidents_touching,
            "changes_before": self.changes_before,
            "incident_plan": self.incident_plan,
            "oncall_summary": self.oncall_summary,
            "metric_shift": self.metric_shift,
        }

    @property
    def names(self) -> list[str]:
        return [*MCP_TOOLS, *self._own]

    def specs(self) -> list[dict[str, Any]]:
        """OpenAI function specs of every tool (the MCP ones from the server's own input schemas)."""
        specs = [
            {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}}
            for t in asyncio.run(self._mcp.list_tools()) if t.name in MCP_TOOLS
        ]
        for name, fn in self._own.items():
            params = {p: {"type": "string" if p.endswith("_id") or p in ("entity", "metric") else "number"}
                      for p in fn.__annotations__ if p != "return"}
            specs.append({"type": "function", "function": {
                "name": name, "description": (fn.__doc__ or "").strip(),
                "parameters": {"type": "object", "properties": params}}})
        return specs

    def call(self, call_id: str, tool: str, args: dict[str, Any]) -> ToolResult:
        if tool in MCP_TOOLS:
            try:
                raw = asyncio.run(self._mcp.call_tool(tool, args))
            except ToolError as err:
                raise VigilInputError(f"{tool}: {err}") from None
            if not isinstance(raw, CallToolResult) or raw.is_error or raw.structured_content is None:
                text = " ".join(getattr(c, "text", "") for c in getattr(raw, "content", []))
                raise VigilInputError(f"{tool}: {text or 'failed'}")
            result = MCP_TOOLS[tool].model_validate(raw.structured_content)
        elif tool in self._own:
            try:
                result = self._own[tool](**args)
            except TypeError as err:
                raise VigilInputError(f"{tool}: bad arguments {sorted(args)}: {err}") from None
        else:
            raise VigilInputError(f"no tool {tool!r}; tools: {', '.join(self.names)}")
        return ToolResult(id=call_id, tool=tool, args=args, result=result)

    # ------------------------------------------------------------------ tools of their own

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
                found.append(_incident_summary(incident))
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
            worst=[_incident_summary(i) for i in worst])

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
