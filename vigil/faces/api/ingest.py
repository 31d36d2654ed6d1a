"""What node agents send between scrapes (their inventory, from which the topology is built, metric samples
and the decoded log lines of the training ranks on their node) and what `vigil launch` reports (a job's
placement, rank exits, step telemetry, its ranks' decoded log lines, the verdict).

The live engine (vigil/run/engine.py) reads them from the store; these routes only validate and store.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request
from pydantic import BaseModel, Field

from vigil.faces.api.auth import Identity, check_operator, check_read
from vigil.faces.api.context import ServeContext
from vigil.model import Event, LaunchReport, Node, Sample, Topology, VigilInputError, node_id, node_of, parse_entity
from vigil.sources.collect.agent import MAX_PENDING_EVENTS
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


class Stored(BaseModel):
    stored: int


class Registered(BaseModel):
    node: str
    topology_version: int


class LaunchStored(BaseModel):
    job: str
    placed: bool
    samples: int
    events: int


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
def push_samples(body: SamplePush, ctx: Ctx, user: Writer) -> Stored:
    """Store an agent's samples for the engine; every sample must be about the pushing node."""
    foreign = next((s.entity for s in body.samples if node_of(s.entity) not in (f"node/{body.node}", None)), None)
    if foreign is not None:
        raise VigilInputError(f"sample for {foreign!r} pushed by node {body.node!r}: a node pushes its own entities")
    return Stored(stored=ctx.store.add_samples(body.node, body.samples))


@router.post("/rank-logs", status_code=201)
def push_rank_logs(body: RankLogPush, ctx: Ctx, user: Writer) -> Stored:
    """Store an agent's decoded rank log lines. As a launch report speaks only for its own job's ranks, a node
    speaks only for ranks placed on it: every event must be a ``rank_log`` on a rank, and where the topology
    places the rank's job (a launch, Slurm, Kubernetes), the rank must be one of its ranks and placed on the
    pushing node. Ranks of a job the topology does not hold yet are taken (its scheduler may list it later)."""
    jobs = {job.id: job for job in (ctx.store.topology() or Topology()).jobs}
    for event in body.events:
        kind, parts = parse_entity(event.entity)
        if event.kind != "rank_log" or kind != "rank":
            raise VigilInputError(f"rank-log push of node {body.node!r}: expected rank_log events on "
                                  f"job/<id>/rank/<r>, got {event.kind!r} on {event.entity!r}")
        job = jobs.get(parts[0])
        if job is None or not job.placement:
            continue
        rank = int(parts[1])
        placed_on = node_of(job.placement[rank]) if rank < len(job.placement) else None
        if placed_on != node_id(body.node):
            where = f"placed on {placed_on}" if placed_on else f"not one of the job's {len(job.placement)} ranks"
            raise VigilInputError(f"rank-log push of node {body.node!r}: {event.entity} is {where}; a node "
                                  "pushes the lines of its own ranks")
    ctx.store.add_events(body.events)
    return Stored(stored=len(body.events))


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
    exits and the verdict, as events (a rank's last lines are read before its exit)."""
    logs = report_logs(body)
    known = next((j for j in (ctx.store.topology() or Topology()).jobs if j.id == body.job), None)
    job = report_job(body, known)
    if job is not None:
        ctx.store.register_job(job)
        ctx.invalidate()
    samples = report_samples(body)
    if samples:
        ctx.store.add_samples(f"launch:{body.job}", samples)
    events = logs + report_events(body)
    ctx.store.add_events(events)
    return LaunchStored(job=body.job, placed=job is not None, samples=len(samples), events=len(events))
