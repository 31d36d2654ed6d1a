"""REST API under /api/v1: the vigil/model.py records are the request and response bodies."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request, Response, status
from pydantic import BaseModel, Field

from vigil.diagnose.memory import remember
from vigil.faces.api.actions import approve, execute
from vigil.faces.api.alertmanager import alerts_to_events, parse_payload
from vigil.faces.api.auth import Identity, check_approver, check_operator, check_read
from vigil.faces.api.context import ServeContext
from vigil.faces.api.diagnosing import DiagnosisQueued, DiagnosisStatus, RerunNotStarted
from vigil.faces.api.hang import StackNode, load_hang_report, stack_tree
from vigil.faces.api.push_keys import alert_key, event_key, unplaced_event_key
from vigil.faces.api.responses import (
    AlertsStored,
    EventsStored,
    GpuRow,
    HangSummary,
    HangView,
    Health,
    JobStepTimes,
    MetricSeries,
    NodeDetail,
    NodeRow,
    PromSample,
    StackTreeNode,
)
from vigil.model import (
    Action,
    ActionKind,
    Diagnosis,
    EntityId,
    Event,
    FaultLevel,
    Incident,
    IncidentStatus,
    Job,
    Topology,
    VigilConflictError,
    VigilInputError,
    parse_entity,
)

router = APIRouter(prefix="/api/v1", dependencies=[Depends(check_read)])
# Open without a token: load balancers and Kubernetes probes poll it.
meta = APIRouter(prefix="/api/v1")
Writer = Annotated[Identity, Depends(check_operator)]
Approver = Annotated[Identity, Depends(check_approver)]
# when a client turned away because no thread could run its rerun may ask again (seconds): threads are back once
# the diagnoses under way end
RERUN_RETRY_AFTER_S = 30


async def ctx_of(request: Request) -> ServeContext:
    return request.app.state.ctx


Ctx = Annotated[ServeContext, Depends(ctx_of)]


def _not_found(what: str, key: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"no {what} {key!r}")


class ActionRequest(BaseModel):
    """Propose an action; it is recorded as ``proposed`` and runs only after approve + execute."""

    model_config = {"extra": "forbid"}

    kind: ActionKind
    target: EntityId
    incident_id: str | None = None
    reason: str = Field(default="", max_length=2000)
    params: dict[str, Any] = Field(default_factory=dict)


class StatusChange(BaseModel):
    model_config = {"extra": "forbid"}

    status: IncidentStatus


@meta.get("/health", tags=["meta"])
def health(ctx: Ctx) -> Health:
    """Liveness with a store round trip (a count), cheap enough for a load balancer to poll."""
    return Health(incidents=ctx.store.count_incidents())


# ------------------------------------------------------------------------------------------ cluster


@router.get("/topology", tags=["cluster"])
def topology(ctx: Ctx) -> Topology:
    return ctx.topology()


@router.get("/nodes", tags=["cluster"])
def nodes(ctx: Ctx) -> list[NodeRow]:
    """Every node with its worst open fault level and its GPUs' levels (healthy .. isolate)."""
    return [NodeRow.model_validate(row) for row in ctx.node_grid()]


@router.get("/nodes/{name}", tags=["cluster"])
def node(name: str, ctx: Ctx) -> NodeDetail:
    """One node: its record, fault level, lifecycle stage and steps, recent events and actions."""
    try:
        return NodeDetail.model_validate(ctx.node_lifecycle(name))
    except KeyError:
        raise _not_found("node", name) from None


@router.get("/gpus", tags=["cluster"])
def gpus(ctx: Ctx, min_level: Annotated[FaultLevel, Query()] = FaultLevel.HEALTHY) -> list[GpuRow]:
    """GPUs at or above ``min_level`` (a label: healthy, observe, degraded, drain, isolate)."""
    return [GpuRow.model_validate({**g, "node": row["name"]}) for row in ctx.node_grid() for g in row["gpus"]
            if g["level"] >= min_level]


@router.get("/jobs", tags=["cluster"])
def jobs(ctx: Ctx) -> list[Job]:
    return ctx.topology().jobs


@router.get("/jobs/{job}", tags=["cluster"])
def job(job: str, ctx: Ctx, last: Annotated[int, Query(ge=1, le=10000)] = 240) -> JobStepTimes:
    """A job's placement and per-rank step times (``vigil_job_step_time_seconds``)."""
    try:
        return JobStepTimes.model_validate(ctx.job_step_times(job, last=last))
    except KeyError:
        raise _not_found("job", job) from None


# ------------------------------------------------------------------------------------------ incidents


@router.get("/incidents", tags=["incidents"])
def incidents(
    ctx: Ctx,
    status_: Annotated[IncidentStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 200,
) -> list[Incident]:
    return ctx.store.incidents(status=status_, limit=limit)


@router.post("/incidents", tags=["incidents"], status_code=status.HTTP_201_CREATED)
def create_incident(incident: Incident, ctx: Ctx, user: Writer) -> Incident:
    """Record an incident (from an external detector); committed before the response is sent. Create-only:
    an id already stored answers 409 and changes nothing (status and diagnosis have their own routes)."""
    try:
        ctx.store.create_incident(incident)
    except VigilConflictError as err:
        raise HTTPException(status.HTTP_409_CONFLICT, str(err)) from None
    ctx.invalidate()
    ctx.diagnoser.want(incident.id)  # diagnosed in the background, now, not on its first view
    return incident


@router.get("/incidents/{incident_id}", tags=["incidents"])
def incident(incident_id: str, ctx: Ctx) -> Incident:
    found = ctx.store.incident(incident_id)
    if found is None:
        raise _not_found("incident", incident_id)
    return found


@router.post("/incidents/{incident_id}/status", tags=["incidents"])
def set_incident_status(incident_id: str, change: StatusChange, ctx: Ctx, user: Writer) -> Incident:
    """Acknowledge or resolve an incident; the change is recorded as an ``incident_status`` event naming who."""
    try:
        changed = ctx.store.set_incident_status(incident_id, change.status, by=user.name)
    except KeyError:
        raise _not_found("incident", incident_id) from None
    if changed.status is IncidentStatus.RESOLVED:
        remember(ctx.store, changed)
    ctx.invalidate()
    return changed


@router.get("/incidents/{incident_id}/diagnosis", tags=["incidents"])
def diagnosis(incident_id: str, ctx: Ctx) -> Diagnosis:
    """The stored diagnosis; 404 while there is none (``.../diagnosis/status`` says whether one is pending)."""
    found = ctx.store.diagnosis(incident_id)
    if found is None:
        raise _not_found("diagnosis for incident", incident_id)
    return found


@router.get("/incidents/{incident_id}/diagnosis/status", tags=["incidents"])
def diagnosis_state(incident_id: str, ctx: Ctx) -> DiagnosisStatus:
    """Whether the incident's diagnosis is stored (done), pending or running in the server's background
    threads, or failed (with the error; POST .../diagnose reruns it). Answers at once, never diagnoses."""
    if ctx.store.incident(incident_id) is None:
        raise _not_found("incident", incident_id)
    status_ = ctx.diagnosis_status(incident_id)
    if status_.pending:
        ctx.diagnoser.want(incident_id)
    return status_


@router.post("/incidents/{incident_id}/diagnose", tags=["incidents"], status_code=status.HTTP_202_ACCEPTED)
def run_diagnosis(incident_id: str, request: Request, response: Response, ctx: Ctx,
                  user: Writer) -> DiagnosisQueued:
    """Rank root causes again (knowledge graph; the LLM when configured) and store the diagnosis, replacing the
    stored one: claimed now and run on a server thread, answered at once (202) with how it stands and the URL
    that tells when it is done (``.../diagnosis/status``: running, then done, or retrying / failed with the
    error); 409 while a server diagnoses the incident already (its result is stored when done); 503 (with
    Retry-After) when this server could not start a thread to run it - its claim released, ask again later."""
    try:
        started = ctx.diagnose_later(incident_id)
    except KeyError:
        raise _not_found("incident", incident_id) from None
    except RerunNotStarted as err:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(err),
                            headers={"Retry-After": str(RERUN_RETRY_AFTER_S)}) from None
    url = str(request.url_for("diagnosis_state", incident_id=incident_id).path)
    response.headers["Location"] = url
    return DiagnosisQueued(**started.model_dump(), status_url=url)


@router.put("/incidents/{incident_id}/diagnosis", tags=["incidents"])
def save_diagnosis(incident_id: str, body: Diagnosis, ctx: Ctx, user: Writer) -> Diagnosis:
    if body.incident_id != incident_id:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            f"field 'incident_id' is {body.incident_id!r} but the path names {incident_id!r}",
        )
    if ctx.store.incident(incident_id) is None:
        raise _not_found("incident", incident_id)
    ctx.store.save_diagnosis(body)
    return body


# ------------------------------------------------------------------------------------------ actions


@router.get("/actions", tags=["actions"])
def actions(
    ctx: Ctx, incident_id: str | None = None, limit: Annotated[int, Query(ge=1, le=10000)] = 200
) -> list[Action]:
    return ctx.store.actions(incident_id=incident_id, limit=limit)


@router.post("/actions", tags=["actions"], status_code=status.HTTP_201_CREATED)
def propose_action(body: ActionRequest, ctx: Ctx, user: Writer) -> Action:
    if body.incident_id is not None and ctx.store.incident(body.incident_id) is None:
        raise _not_found("incident", body.incident_id)
    action = Action(
        ts=time.time(),
        kind=body.kind,
        target=body.target,
        incident_id=body.incident_id,
        reason=body.reason,
        requested_by=user.name,
        params=body.params,
    )
    ctx.store.add_action(action)
    return action


@router.post("/actions/{action_id}/approve", tags=["actions"])
def approve_action(action_id: str, ctx: Ctx, user: Approver) -> Action:
    """proposed -> approved (idempotent for an approved action). Needs the approver role; with the two-person
    rule on (the default) the user who proposed a destructive action cannot approve it."""
    return approve(ctx, action_id, user)


@router.post("/actions/{action_id}/execute", tags=["actions"])
def execute_action(action_id: str, ctx: Ctx, user: Writer, dry_run: Annotated[bool, Query()] = True) -> Action:
    """Run an approved action through the server's remedy back end; the action records the verdict.
    ``dry_run=true`` (the default) calls no back end and changes nothing: the action, proposed or approved, comes
    back as it is, its ``result`` saying what a real run would do now (or why the guard would refuse it) and
    ``params.dry_run_status`` the status it would get; the audit log records the dry run. A real run also needs
    ``execute_actions`` on in the settings."""
    return execute(ctx, action_id, user, dry_run=dry_run)


# ------------------------------------------------------------------------------------------ events


@router.get("/events", tags=["events"])
def events(
    ctx: Ctx,
    entity: str | None = None,
    kind: str | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> list[Event]:
    if entity is not None:
        parse_entity(entity)
    return ctx.store.events(entity=entity, kind=kind, since=since, until=until, limit=limit)


@router.post("/events", tags=["events"], status_code=status.HTTP_201_CREATED)
def add_events(body: Annotated[list[Event], Body(max_length=10000)], ctx: Ctx, user: Writer) -> EventsStored:
    """Store events (an agent's kernel, GPU, network and Kubernetes events; a log forwarder's lines). A push sent
    again - a sender retries one whose answer it did not get - stores its events once: an event equal in every
    field to one stored already is accepted and counted in ``duplicates``, not stored a second time
    (``push_keys.event_key``). A kernel event that says where its line was read, and that an agent before those
    positions stored without them (an upgraded agent reading the last hour again), is a duplicate too
    (``push_keys.unplaced_event_key``)."""
    unplaced = [unplaced_event_key(e) for e in body]
    held = ctx.store.held_event_keys(k for k in unplaced if k is not None)
    fresh = [e for e, k in zip(body, unplaced, strict=True) if k is None or k not in held]
    written = ctx.store.add_events(fresh, [event_key(e) for e in fresh])
    return EventsStored(stored=len(body), duplicates=len(body) - written)


@router.post("/alertmanager", tags=["events"])
def alertmanager_webhook(payload: Annotated[dict[str, Any], Body()], ctx: Ctx, user: Writer) -> AlertsStored:
    """Alertmanager webhook (payload version 4; unknown fields accepted): each alert becomes an Event. Alertmanager
    sends a firing alert again every ``repeat_interval`` and a notification again when this answer was lost; an
    alert with the fingerprint, start and status of one stored already is accepted and counted in ``duplicates``,
    not stored a second time (``push_keys.alert_key``): its resolution is stored once, and it firing again after it
    resolved (a new start) is a new event. ``vigil_alertmanager_alerts_total`` counts each alert once, the
    repeats are counted in ``vigil_alertmanager_alert_repeats_total``."""
    parsed = parse_payload(payload)
    new_events = alerts_to_events(parsed, cluster=ctx.collector.cluster)
    written = ctx.store.add_events_once(new_events, [alert_key(alert, parsed.common_labels) for alert in parsed.alerts])
    for alert, new in zip(parsed.alerts, written, strict=True):
        (ctx.collector.alerts_received if new else ctx.collector.alerts_repeated)[alert.status] += 1
    return AlertsStored(stored=len(new_events), duplicates=written.count(False),
                        entities=sorted({e.entity for e in new_events}))


# ------------------------------------------------------------------------------------------ metrics


@router.get("/metrics/series", tags=["metrics"])
def metric_series(
    ctx: Ctx,
    entity: str,
    metric: Annotated[str, Query(pattern=r"^[A-Za-z_:][A-Za-z0-9_:]*$", max_length=200)],
    start: float | None = None,
    end: float | None = None,
) -> MetricSeries:
    """One entity's metric from the configured source (embedded store or Prometheus)."""
    parse_entity(entity)
    ts, values = ctx.series(entity, metric, start, end)
    return MetricSeries(entity=entity, metric=metric, ts=ts.tolist(),
                        values=[None if v != v else float(v) for v in values])


@router.get("/metrics/query", tags=["metrics"])
def promql_query(
    ctx: Ctx,
    query: Annotated[str, Query(min_length=1, max_length=4000)],
    time_: Annotated[float | None, Query(alias="time")] = None,
) -> list[PromSample]:
    """A PromQL instant query against the configured Prometheus-compatible API."""
    if ctx.prom is None:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, "no Prometheus-compatible API configured: set VIGIL_METRICS_URL"
        )
    found = ctx.prom.query(query, at=time_)
    return [PromSample(labels=s.labels, ts=float(s.ts[0]), value=float(s.values[0])) for s in found]


# ------------------------------------------------------------------------------------------ hangs


@router.get("/hangs", tags=["hangs"])
def hangs(ctx: Ctx) -> list[HangSummary]:
    """Runs of ``vigil launch`` under the server's launch directories, with their verdicts."""
    out = []
    for name, path in sorted(ctx.hang_reports().items()):
        try:
            report = load_hang_report(path)
            out.append(HangSummary(name=name, verdict=report.verdict, culprit_ranks=report.culprit_ranks,
                                   hang_kind=report.hang_kind))
        except VigilInputError as err:
            out.append(HangSummary(name=name, verdict="unreadable", error=str(err)))
    return out


@router.get("/hangs/{name}", tags=["hangs"])
def hang(name: str, ctx: Ctx) -> HangView:
    """One run's typed diagnosis and the stack tree of all its ranks with the fork point marked."""
    path = ctx.hang_reports().get(name)
    if path is None:
        raise _not_found("launch run", name)
    report = load_hang_report(path)
    tree = stack_tree(report.stacks, report.fork_point)
    return HangView(name=report.name, world_size=report.world_size, diagnosis=report.diagnosis,
                    stack_tree=_tree(tree))


def _tree(node: StackNode) -> StackTreeNode:
    return StackTreeNode(frame=node.frame, ranks=node.ranks, fork_point=node.is_fork_point,
                         children=[_tree(c) for c in node.children])
