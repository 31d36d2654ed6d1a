"""What node agents send between scrapes (their inventory, from which the topology is built, metric samples
and the decoded log lines of the training ranks on their node) and what `vigil launch` reports (a job's
placement, rank exits, step telemetry, its ranks' decoded log lines, the verdict).

The live engine (vigil/run/engine.py) reads them from the store; these routes only validate and store.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Request, Response
from pydantic import BaseModel, Field

from vigil.faces.api.auth import Identity, check_operator, check_read
from vigil.faces.api.context import ServeContext
from vigil.faces.api.push_keys import event_key, launch_steps_key, rank_log_key, samples_digest, samples_key
from vigil.faces.api.responses import SamplesStored
from vigil.model import (
    Event,
    IdempotencyKeyReused,
    Job,
    LaunchReport,
    Node,
    Sample,
    Topology,
    VigilInputError,
    node_id,
    node_of,
    parse_entity,
)
from vigil.sources.collect.agent import (
    MAX_PENDING_EVENTS,
    NOT_RANK_LOG,
    RANK_ON_ANOTHER_NODE,
    RANK_OUTSIDE_JOB,
)
from vigil.sources.launch import report_events, report_job, report_logs, report_samples

router = APIRouter(prefix="/api/v1", tags=["agents"], dependencies=[Depends(check_read)])
Writer = Annotated[Identity, Depends(check_operator)]


async def ctx_of(request: Request) -> ServeContext:
    return request.app.state.ctx


Ctx = Annotated[ServeContext, Depends(ctx_of)]


class SamplePush(BaseModel):
    """One agent's latest value of every metric it reads (dcgm-exporter names for GPUs, vigil_* otherwise)."""

    model_config = {"extra": "forbid"}

    node: str = Field(min_length=1, max_length=200)
    samples: list[Sample] = Field(max_length=200_000)


class RankLogPush(BaseModel):
    """One agent's decoded rank log lines (``rank_log`` events on ranks, ``vigil.sources.collect.rank_files``)."""

    model_config = {"extra": "forbid"}

    node: str = Field(min_length=1, max_length=200)
    # an agent pushes at most the events it keeps while the server is away
    events: list[Event] = Field(max_length=MAX_PENDING_EVENTS)


class Registered(BaseModel):
    node: str
    topology_version: int


class LaunchStored(BaseModel):
    job: str
    placed: bool
    samples: int
    events: int
    # events a report sent earlier stored already (the same report sent again after its answer was lost), not
    # stored twice
    duplicates: int = 0
    # the same for the step telemetry's samples: all of them or none (they are one push)
    duplicate_samples: int = 0


class EngineProgress(BaseModel):
    """How far the live engine has read: row ids of the last event and metric push it processed, the rounds
    it has done (over restarts) and when the last one ended."""

    events: int
    pushes: int
    ticks: int
    at: float | None


@router.get("/engine")
def engine_progress(ctx: Ctx) -> EngineProgress:
    _, state = ctx.store.cursor("engine")
    return EngineProgress(events=int(state.get("events", 0)), pushes=int(state.get("pushes", 0)),
                          ticks=int(state.get("ticks", 0)), at=state.get("at"))


@router.post("/samples", status_code=201)
def push_samples(
    body: SamplePush, ctx: Ctx, user: Writer,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
) -> SamplesStored:
    """Store an agent's samples for the engine; every sample must be about the pushing node. A push named by an
    ``Idempotency-Key`` header that the node sent already (sent again after its answer was lost) is accepted and
    its samples counted in ``duplicates``, not stored twice (``push_keys.samples_key``); a push without one (an
    older agent's) is stored as it comes. A key the node sent before with other samples is not that push sent
    again: it is refused with 422 and nothing stored (``push_keys.samples_digest``)."""
    foreign = next((s.entity for s in body.samples if node_of(s.entity) not in (f"node/{body.node}", None)), None)
    if foreign is not None:
        raise VigilInputError(f"sample for {foreign!r} pushed by node {body.node!r}: a node pushes its own entities")
    key = samples_key(body.node, idempotency_key) if idempotency_key is not None else None
    try:
        written = ctx.store.add_samples(body.node, body.samples, key,
                                        samples_digest(body.samples) if key is not None else None)
    except IdempotencyKeyReused:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {idempotency_key!r} of node {body.node!r} named an earlier push with other samples: a "
            "key names one push, sent again as it was; this push was not stored (send it under a new key)") from None
    return SamplesStored(stored=len(body.samples), duplicates=len(body.samples) - written)


# Refused events listed one by one in an answer (all are counted by reason).
MAX_LISTED_REFUSALS = 100


class RankLogRefusal(BaseModel):
    index: int  # the event's position in the push
    entity: str
    reason: str  # one of RANK_LOG_REFUSALS
    detail: str


class RankLogStored(BaseModel):
    """What a rank-log push stored: the accepted events, and the refused ones counted by reason (the first
    ``MAX_LISTED_REFUSALS`` listed with their position in the push)."""

    stored: int  # = accepted (the answer's field before refusals were per event)
    accepted: int
    # accepted events stored by an earlier push already (a push sent again after its answer was lost), not
    # stored twice
    duplicates: int = 0
    rejected: int
    rejected_by_reason: dict[str, int]
    rejections: list[RankLogRefusal]


def _refusal(event: Event, node: str, jobs: dict[str, Job]) -> tuple[str, str] | None:
    """Why the push of ``node`` may not store ``event`` (reason, detail), or None when it may."""
    kind, parts = parse_entity(event.entity)
    if event.kind != "rank_log" or kind != "rank":
        return NOT_RANK_LOG, f"expected rank_log events on job/<id>/rank/<r>, got {event.kind!r} on {event.entity!r}"
    job = jobs.get(parts[0])
    if job is None or not job.placement:
        return None  # a job the topology does not hold (yet): its scheduler may list it later
    rank = int(parts[1])
    if rank >= len(job.placement):
        return RANK_OUTSIDE_JOB, f"{event.entity} is not one of the job's {len(job.placement)} ranks"
    placed_on = node_of(job.placement[rank])
    if placed_on != node_id(node):
        return RANK_ON_ANOTHER_NODE, (f"{event.entity} is placed on {placed_on}; a node pushes the lines of its "
                                      "own ranks")
    return None


@router.post("/rank-logs", status_code=201, responses={200: {"model": RankLogStored, "description": "stored in "
             "part: the events listed in rejections were refused, every other one was stored"}})
def push_rank_logs(body: RankLogPush, ctx: Ctx, user: Writer, response: Response) -> RankLogStored:
    """Store an agent's decoded rank log lines. As a launch report speaks only for its own job's ranks, a node
    speaks only for ranks placed on it: an event is stored only if it is a ``rank_log`` on a rank and, where the
    topology places the rank's job (a launch, Slurm, Kubernetes), the rank is one of its ranks and placed on the
    pushing node. Ranks of a job the topology does not hold yet are taken (its scheduler may list it later).

    Each event is judged alone: the valid ones are stored and the others refused with their reason. 201 when
    every event was stored; 200 when some (or all) were refused, the answer counting them by reason and listing
    the first ones. A body that is not a push at all (no node, an event that is not an event) is 422.

    A push sent again - the agent retries one whose answer it did not get - stores its lines once: an event that
    says where its line was read (``push_key``) and is stored already is accepted and counted in ``duplicates``,
    not stored a second time."""
    jobs = {job.id: job for job in (ctx.store.topology() or Topology()).jobs}
    accepted: list[Event] = []
    refused: list[RankLogRefusal] = []
    by_reason: dict[str, int] = {}
    for index, event in enumerate(body.events):
        found = _refusal(event, body.node, jobs)
        if found is None:
            accepted.append(event)
            continue
        reason, detail = found
        by_reason[reason] = by_reason.get(reason, 0) + 1
        if len(refused) < MAX_LISTED_REFUSALS:
            refused.append(RankLogRefusal(index=index, entity=event.entity, reason=reason,
                                          detail=f"rank-log push of node {body.node!r}: {detail}"))
    written = ctx.store.add_events(accepted, [rank_log_key(body.node, e) for e in accepted]) if accepted else 0
    if by_reason:
        response.status_code = 200
    rejected = sum(by_reason.values())
    return RankLogStored(stored=len(accepted), accepted=len(accepted), duplicates=len(accepted) - written,
                         rejected=rejected, rejected_by_reason=by_reason, rejections=refused)


@router.post("/inventory", status_code=201)
def register_inventory(node: Annotated[Node, Body()], ctx: Ctx, user: Writer) -> Registered:
    """A node's GPUs and NICs as its agent found them, merged into the topology (a new version if changed)."""
    owners = [g.node for g in node.gpus] + [n.node for n in node.nics]
    stray = next((owner for owner in owners if owner != node.name), None)
    if stray is not None:
        raise VigilInputError(f"inventory of node {node.name!r} lists a device of node {stray!r}")
    version = ctx.store.register_node(node)
    ctx.invalidate()
    return Registered(node=node.name, topology_version=version)


@router.post("/launches", status_code=201)
def report_launch(body: LaunchReport, ctx: Ctx, user: Writer) -> LaunchStored:
    """A `vigil launch` report: the job's rank -> node / GPU placement into the topology (before the rest, so
    the engine places what follows), step telemetry as the job's samples; the ranks' decoded log lines, then rank
    exits and the verdict, as events (a rank's last lines are read before its exit). A report sent again stores
    its events once (``push_keys.event_key``) and its step telemetry once (``push_keys.launch_steps_key``); the
    answer counts them in ``duplicates`` and ``duplicate_samples``."""
    logs = report_logs(body)
    known = next((j for j in (ctx.store.topology() or Topology()).jobs if j.id == body.job), None)
    job = report_job(body, known)
    if job is not None:
        ctx.store.register_job(job)
        ctx.invalidate()
    samples = report_samples(body)
    samples_written = ctx.store.add_samples(f"launch:{body.job}", samples, launch_steps_key(body.job, body.steps))
    events = logs + report_events(body)
    written = ctx.store.add_events(events, [event_key(e) for e in events])
    return LaunchStored(job=body.job, placed=job is not None, samples=len(samples), events=len(events),
                        duplicates=len(events) - written, duplicate_samples=len(samples) - samples_written)
