"""The cluster heat map as data: every GPU's fault level at a time T, in columns small enough for 10,000 GPUs.

The dashboard's cluster page draws this on a canvas; the same JSON serves scripts. Levels at T come from the
incident table: an incident counts at T when it started by T and was still open then (status ``open``, or it
ended at or after T). Without T the map is the store's present (open incidents only), as ``/api/v1/nodes``.

A change cursor (a digest of the incident table's ids, statuses, levels and ends, and of the topology) tells
the live stream and the caches when anything a map shows may have changed, with or without an engine writing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from vigil.faces.api.auth import check_read
from vigil.faces.api.context import ServeContext, change_cursor
from vigil.model import FaultLevel, Incident, IncidentStatus, Topology, VigilInputError, parse_entity

router = APIRouter(prefix="/api/v1/cluster", tags=["cluster"], dependencies=[Depends(check_read)])

# The live stream asks the store this often; clients share one cursor query per interval.
POLL_S = 1.0
# A stream ends after this long and the browser's EventSource reconnects: no connection is held forever.
STREAM_LIFETIME_S = 300.0


class MapJob(BaseModel):
    """A training job's GPUs as runs of flat GPU positions: ``[[first, count], ...]``."""

    id: str
    name: str
    gpu_runs: list[tuple[int, int]]


class MapIncident(BaseModel):
    """An incident counted at the map's time, with the GPUs and nodes it touches as flat positions."""

    id: str
    title: str
    level: FaultLevel
    status: IncidentStatus
    start: float
    fault_types: list[str]
    gpus: list[int]
    nodes: list[int]


class ClusterMap(BaseModel):
    """Columns, not rows: node ``i`` has GPUs ``gpu_start[i] .. gpu_start[i+1]-1``; ``gpu_levels`` holds one
    digit (0 healthy .. 4 isolate) per GPU in that order, ``node_levels`` one per node (the node's own faults:
    node and NIC entities)."""

    at: float | None = Field(description="the time the levels hold at; null = now (open incidents)")
    cursor: str = Field(description="change cursor of the data the map was built from")
    span: tuple[float, float] | None = Field(description="first incident start .. last incident end")
    level_names: list[str]
    switches: list[str]
    racks: list[str]
    nodes: list[str]
    node_switch: list[int] = Field(description="index into switches per node (-1: none)")
    node_rack: list[int] = Field(description="index into racks per node (-1: none)")
    gpu_start: list[int] = Field(description="flat position of each node's first GPU, plus the total at the end")
    gpu_index: dict[int, list[int]] = Field(
        default_factory=dict, description="GPU indices of nodes whose GPUs are not numbered 0..n-1"
    )
    gpu_levels: str
    node_levels: str
    counts: dict[str, int] = Field(description="GPUs per level name")
    jobs: list[MapJob]
    incidents: list[MapIncident]


class MapChange(BaseModel):
    """``event: levels`` on the live stream: the map's data changed; fetch the map again."""

    cursor: str
    counts: dict[str, int]


class IncidentOpened(BaseModel):
    """``event: incident`` on the live stream: an incident opened since the stream's last look."""

    id: str
    title: str
    level: FaultLevel
    scope: str


@dataclass
class _Layout:
    """What the map needs from the topology, built once per topology."""

    topology: Topology
    nodes: list[str]
    switches: list[str]
    racks: list[str]
    node_switch: list[int]
    node_rack: list[int]
    gpu_start: list[int]
    gpu_index: dict[int, list[int]]
    node_pos: dict[str, int]
    gpu_pos: dict[tuple[str, str], int]
    jobs: list[MapJob]


def _layout(topology: Topology) -> _Layout:
    switches: dict[str, int] = {}
    racks: dict[str, int] = {}
    node_switch, node_rack, gpu_start = [], [], []
    gpu_index: dict[int, list[int]] = {}
    node_pos: dict[str, int] = {}
    gpu_pos: dict[tuple[str, str], int] = {}
    flat = 0
    for i, node in enumerate(topology.nodes):
        node_pos[node.name] = i
        node_switch.append(switches.setdefault(node.switch, len(switches)) if node.switch else -1)
        node_rack.append(racks.setdefault(node.rack, len(racks)) if node.rack else -1)
        gpu_start.append(flat)
        indices = sorted(g.index for g in node.gpus)
        if indices != list(range(len(indices))):
            gpu_index[i] = indices
        for index in indices:
            gpu_pos[(node.name, str(index))] = flat
            flat += 1
    gpu_start.append(flat)
    jobs = []
    for job in topology.jobs:
        positions = sorted(
            p for p in (gpu_pos.get(_gpu_key(entity)) for entity in job.placement) if p is not None
        )
        runs: list[tuple[int, int]] = []
        for p in positions:
            if runs and runs[-1][0] + runs[-1][1] == p:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            elif not runs or runs[-1][0] + runs[-1][1] < p:
                runs.append((p, 1))
        jobs.append(MapJob(id=job.id, name=job.name, gpu_runs=runs))
    return _Layout(
        topology, [n.name for n in topology.nodes], list(switches), list(racks), node_switch, node_rack,
        gpu_start, gpu_index, node_pos, gpu_pos, jobs,
    )


def _gpu_key(entity: str) -> tuple[str, str]:
    parts = entity.split("/")
    return (parts[1], parts[2]) if len(parts) == 3 and parts[0] == "gpu" else ("", "")


def open_at(incident: Incident, at: float | None) -> bool:
    """Whether the incident counts on the map at ``at`` (None: now, where only open incidents count)."""
    if at is None:
        return incident.status is IncidentStatus.OPEN
    return incident.start <= at and (incident.status is IncidentStatus.OPEN or incident.end >= at)


class ClusterMapSource:
    """Builds maps from the store, re-reading the topology and the incidents only when the cursor moves."""

    def __init__(self, ctx: ServeContext, cursor_ttl_s: float = 0.5) -> None:
        self.ctx = ctx
        self.cursor_ttl_s = cursor_ttl_s
        self._lock = threading.Lock()
        self._cursor: tuple[float, str, str] | None = None  # (taken, topology digest, cursor)
        self._layout: tuple[str, _Layout] | None = None
        self._incidents: tuple[str, list[Incident]] | None = None

    def cursor(self) -> str:
        """The change cursor, read from the store at most every ``cursor_ttl_s`` whoever asks."""
        return self._current()[1]

    def _current(self) -> tuple[str, str]:
        with self._lock:
            now = time.monotonic()
            if self._cursor is None or now - self._cursor[0] >= self.cursor_ttl_s:
                self._cursor = (now, *change_cursor(self.ctx.store))
            return self._cursor[1], self._cursor[2]

    def _data(self) -> tuple[str, _Layout, list[Incident]]:
        topo_digest, cursor = self._current()
        with self._lock:
            if self._layout is None or self._layout[0] != topo_digest:
                self._layout = (topo_digest, _layout(self.ctx.store.topology() or Topology()))
            if self._incidents is None or self._incidents[0] != cursor:
                self._incidents = (cursor, self.ctx.store.incidents(limit=10_000_000))
            return cursor, self._layout[1], self._incidents[1]

    def jobs(self) -> list[MapJob]:
        return self._data()[1].jobs

    def incidents(self) -> list[Incident]:
        """Every stored incident, newest first, parsed once per change of the cursor."""
        return self._data()[2]

    def open_incidents(self) -> list[Incident]:
        return [i for i in self._data()[2] if open_at(i, None)]

    def build(self, at: float | None = None) -> ClusterMap:
        cursor, layout, incidents = self._data()
        gpu_levels = bytearray(b"0" * layout.gpu_start[-1])
        node_levels = bytearray(b"0" * len(layout.nodes))
        counted = []
        for incident in incidents:
            if not open_at(incident, at):
                continue
            digit = ord("0") + int(incident.level)
            gpus: set[int] = set()
            nodes: set[int] = set()
            for entity in incident.entities:
                kind = entity.split("/", 1)[0]
                if kind == "gpu":
                    pos = layout.gpu_pos.get(_gpu_key(entity))
                    if pos is not None:
                        gpus.add(pos)
                        gpu_levels[pos] = max(gpu_levels[pos], digit)
                elif kind in ("node", "nic"):
                    node = layout.node_pos.get(parse_entity(entity)[1][0])
                    if node is not None:
                        nodes.add(node)
                        node_levels[node] = max(node_levels[node], digit)
            counted.append(
                MapIncident(
                    id=incident.id, title=incident.title, level=incident.level, status=incident.status,
                    start=incident.start, fault_types=incident.fault_types, gpus=sorted(gpus), nodes=sorted(nodes),
                )
            )
        counted.sort(key=lambda i: (-int(i.level), -i.start))
        counts = {level.label: gpu_levels.count(ord("0") + int(level)) for level in FaultLevel}
        span = (min(i.start for i in incidents), max(i.end for i in incidents)) if incidents else None
        return ClusterMap(
            at=at, cursor=cursor, span=span, level_names=[level.label for level in FaultLevel],
            switches=layout.switches, racks=layout.racks, nodes=layout.nodes, node_switch=layout.node_switch,
            node_rack=layout.node_rack, gpu_start=layout.gpu_start, gpu_index=layout.gpu_index,
            gpu_levels=gpu_levels.decode(), node_levels=node_levels.decode(), counts=counts, jobs=layout.jobs,
            incidents=counted,
        )


def source_of(request: Request) -> ClusterMapSource:
    source: ClusterMapSource = request.app.state.cluster_map
    return source


@router.get("/map", response_model_exclude_none=False)
def cluster_map(
    request: Request, at: Annotated[float | None, Query(description="unix time; omit for now")] = None
) -> ClusterMap:
    """Every GPU's fault level at ``at`` (default now), the topology it sits in, jobs and counted incidents,
    in a compact column form (about 100 KB for 10,000 GPUs)."""
    if at is not None and not at == at:
        raise VigilInputError("bad 'at': expected a unix time in seconds")
    return source_of(request).build(at)


def _sse(event: str, data: BaseModel) -> str:
    return f"event: {event}\ndata: {data.model_dump_json()}\n\n"


async def _changes(request: Request, source: ClusterMapSource) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    cursor = await run_in_threadpool(source.cursor)
    seen = {i.id for i in await run_in_threadpool(source.open_incidents)}
    born = time.monotonic()
    while time.monotonic() - born < STREAM_LIFETIME_S:
        await asyncio.sleep(POLL_S)
        if await request.is_disconnected():
            return
        now = await run_in_threadpool(source.cursor)
        if now == cursor:
            yield ": idle\n\n"  # a comment line keeps proxies from closing a quiet stream
            continue
        cursor = now
        opened = await run_in_threadpool(source.open_incidents)
        for incident in opened:
            if incident.id not in seen:
                yield _sse(
                    "incident",
                    IncidentOpened(id=incident.id, title=incident.title, level=incident.level, scope=incident.scope),
                )
        seen = {i.id for i in opened}
        present = await run_in_threadpool(source.build)
        yield _sse("levels", MapChange(cursor=present.cursor, counts=present.counts))


@router.get(
    "/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}},
)
async def cluster_stream(request: Request) -> StreamingResponse:
    """Server-sent events: ``levels`` (a MapChange) when any level or incident changes, ``incident`` (an
    IncidentOpened) for each newly opened incident. Polls the store's change cursor, so it follows whatever
    writes the store: the engine, the API, or a batch pipeline."""
    return StreamingResponse(
        _changes(request, source_of(request)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )

