"""MCP server for agents (official ``mcp`` SDK, v2 ``MCPServer``): Vigil's tools over stdio or streamable
HTTP.

Tools compute, the model explains: every tool returns small, already-computed JSON (summaries, statistics,
downsampled series), never a raw dump, so an agent's context stays within budget. The server is read-only;
``allow_writes=True`` (``vigil mcp --allow-writes``) adds ``propose_action``, ``approve_action`` and
``execute_action``, decided as the REST API decides them (``vigil.faces.api.actions``): dry-run by default, real
execution only with execute_actions on.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import numpy as np
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

from vigil.faces.api.actions import approve, execute
from vigil.faces.api.analysis import Analysis, incident_summary
from vigil.faces.api.auth import mcp_identity
from vigil.faces.api.context import ServeContext
from vigil.faces.api.responses import (
    ActionItem,
    EvidenceItem,
    GpuHealth,
    HealthReport,
    IncidentDetail,
    IncidentList,
    JobHealth,
    LogHit,
    LogSearch,
    MetricPoints,
    MetricStats,
    NodeHealth,
    RankOnBadHardware,
    StepTimeStats,
    XidExplanation,
)
from vigil.knowledge.xid import xid_info
from vigil.model import (
    Action,
    ActionKind,
    FaultLevel,
    IncidentStatus,
    VigilInputError,
    covers,
    node_of,
    parse_entity,
)

MAX_POINTS = 500
Result = TypeVar("Result", bound=BaseModel)
INSTRUCTIONS = (
    "Vigil watches an AI training cluster. Start with list_incidents or node_health, drill into one incident "
    "with get_incident, check numbers with query_metrics or metric_shift, rank what moved at an incident's start "
    "with correlate_incident, decode GPU Xid codes with explain_xid, look at a training job with diagnose_job, "
    "job_events or compare_jobs (beside a peer job), and find what fixed similar past incidents with "
    "similar_incidents or search_memory. Cite evidence refs (ev-...) from the results."
)


def _downsample(ts: np.ndarray, values: np.ndarray, max_points: int) -> tuple[list[float], list[float | None]]:
    if len(ts) > max_points:
        pick = np.linspace(0, len(ts) - 1, max_points).round().astype(int)
        ts, values = ts[pick], values[pick]
    return ts.tolist(), [None if not np.isfinite(v) else round(float(v), 6) for v in values]


def build_mcp_server(ctx: ServeContext, *, allow_writes: bool = False) -> MCPServer:
    server: MCPServer = MCPServer("vigil", instructions=INSTRUCTIONS)

    def tool(fn: Callable[..., Result]) -> Callable[..., Result]:
        """Register ``fn``; a VigilInputError reaches the agent as its one-line message (the SDK hides the
        text of any other exception)."""

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Result:
            try:
                return fn(*args, **kwargs)
            except VigilInputError as err:
                raise ToolError(str(err)) from None

        server.add_tool(checked)
        return fn

    @tool
    def list_incidents(
        status: Literal["open", "acknowledged", "resolved", "any"] = "open", limit: int = 20
    ) -> IncidentList:
        """Incidents, newest first, as one-line summaries (id, title, level, scope, fault types, time)."""
        limit = max(1, min(limit, 200))
        wanted = None if status == "any" else IncidentStatus(status)
        found = ctx.store.incidents(status=wanted, limit=limit)
        return IncidentList(count=len(found), incidents=[incident_summary(i) for i in found])

    @tool
    def get_incident(incident_id: str) -> IncidentDetail:
        """One incident with its evidence (first 30 items), diagnosis (ranked causes, plan) and actions; while the
        server is still diagnosing it, diagnosis is null and diagnosis_pending true (ask again in a few seconds)."""
        incident = ctx.store.incident(incident_id)
        if incident is None:
            raise VigilInputError(f"no incident {incident_id!r}; call list_incidents for ids")
        diagnosis = ctx.store.diagnosis(incident_id)
        state = ctx.diagnosis_status(incident_id) if diagnosis is None else None
        if state is not None and state.pending:
            ctx.diagnoser.want(incident_id)
        return IncidentDetail(
            **{**incident_summary(incident).model_dump(), "entities": incident.entities},
            evidence=[EvidenceItem.model_validate(e.model_dump(exclude={"attrs"})) for e in incident.evidence[:30]],
            evidence_total=len(incident.evidence),
            diagnosis=diagnosis,
            diagnosis_state=state.state if state is not None else "done",
            diagnosis_pending=state.pending if state is not None else False,
            diagnosis_error=state.error if state is not None else "",
            actions=[ActionItem.model_validate(a.model_dump(exclude={"params"}))
                     for a in ctx.store.actions(incident_id=incident_id)],
        )

    @tool
    def node_health(node: str | None = None, min_level: str = "observe") -> HealthReport:
        """Fault levels (healthy < observe < degraded < drain < isolate) of nodes and GPUs at or above
        min_level; with ``node`` (a name like n003) every GPU of that node."""
        floor = int(FaultLevel.parse(min_level))
        rows = ctx.node_grid()
        if node is not None:
            rows = [r for r in rows if r["name"] == node]
            if not rows:
                raise VigilInputError(f"no node {node!r} in the topology")
            floor = 0
        out = []
        for row in rows:
            gpus = [GpuHealth(gpu=g["id"], level=FaultLevel(g["level"])) for g in row["gpus"]
                    if g["level"] >= floor]
            if row["level"] >= floor or gpus:
                out.append(NodeHealth(node=row["id"], level=FaultLevel(row["level"]), gpus=gpus))
        return HealthReport(nodes_total=len(ctx.node_grid()), matching=len(out), nodes=out)

    @tool
    def query_metrics(
        entity: str, metric: str, start: float | None = None, end: float | None = None, max_points: int = 120
    ) -> MetricPoints:
        """One entity's metric (e.g. gpu/n003/5, DCGM_FI_DEV_GPU_TEMP) as statistics plus a series
        downsampled to max_points; times are Unix seconds."""
        parse_entity(entity)
        ts, values = ctx.series(entity, metric, start, end)
        finite = values[np.isfinite(values)] if len(values) else values
        stats = (
            MetricStats(min=float(finite.min()), max=float(finite.max()), mean=float(finite.mean()),
                        last=float(finite[-1]))
            if len(finite)
            else None
        )
        points_ts, points = _downsample(ts, values, max(2, min(max_points, MAX_POINTS)))
        return MetricPoints(entity=entity, metric=metric, points_total=int(len(ts)), stats=stats, ts=points_ts,
                            values=points)

    @tool
    def diagnose_job(job_id: str) -> JobHealth:
        """A training job's health: ranks placed on unhealthy GPUs or nodes, the open incidents touching
        its nodes, and per-rank step-time statistics (straggler = slowest median)."""
        topology = ctx.topology()
        job = next((j for j in topology.jobs if j.id == job_id.removeprefix("job/")), None)
        if job is None:
            raise VigilInputError(f"no job {job_id!r}; known jobs: {', '.join(j.id for j in topology.jobs[:20])}")
        health = ctx.store.node_health()
        bad_ranks = []
        job_nodes = set()
        for rank, placed in enumerate(job.placement):  # a GPU, or the node of a rank that uses none
            node = node_of(placed) or placed
            job_nodes.add(node)
            level = max(int(health.get(placed, 0)), int(health.get(node, 0)))
            if level > 0:
                bad_ranks.append(RankOnBadHardware(rank=rank, gpu=placed, level=FaultLevel(level)))
        incidents = [
            incident_summary(i)
            for status in (IncidentStatus.OPEN, IncidentStatus.ACKNOWLEDGED)
            for i in ctx.store.incidents(status=status, limit=1000)
            if any(covers(job.entity, e) or node_of(e) in job_nodes for e in (i.scope, *i.entities))
        ]
        steps = ctx.job_step_times(job.id)
        rank_medians = {
            r: float(np.nanmedian([v for v in d["values"] if v is not None]))
            for r, d in steps["ranks"].items()
            if any(v is not None for v in d["values"])
        }
        job_values = [v for v in steps["job_series"]["values"] if v is not None]
        straggler = max(rank_medians, key=lambda r: rank_medians[r]) if rank_medians else None
        return JobHealth(
            job=job.id,
            world_size=job.world_size,
            ranks_on_unhealthy_hardware=bad_ranks,
            incidents=incidents[:20],
            step_time_median_s_by_rank=rank_medians,
            straggler_rank=straggler,
            job_step_time_s=(
                StepTimeStats(median=float(np.median(job_values)), last=job_values[-1], max=max(job_values))
                if job_values
                else None
            ),
        )

    @tool
    def explain_xid(code: int) -> XidExplanation:
        """What an NVIDIA Xid code means, its fault level and the action Vigil takes for it."""
        info = xid_info(code)
        return XidExplanation(
            xid=info.code,
            mnemonic=info.mnemonic,
            description=info.description,
            nvidia_action=info.bucket,
            level=info.level,
            vigil_action=info.action.value,
            known=info.known,
        )

    @tool
    def search_logs(text: str, entity: str | None = None, limit: int = 50) -> LogSearch:
        """Substring search over stored log lines (rank logs, kernel Xid lines, NCCL errors) and event
        messages, optionally for one entity and what lies under it (job/j7 covers its ranks)."""
        if not text.strip():
            raise VigilInputError("search text is empty")
        if entity is not None:
            parse_entity(entity)
        limit = max(1, min(limit, 200))
        hits = [
            LogHit(ts=e.ts, entity=e.entity, source=e.source, kind=e.kind, line=e.message[:500])
            for e in ctx.search_events(text, entity=entity, limit=limit)
        ]
        hits.extend(
            LogHit(ts=r.ts, entity=r.entity, source=r.source, kind="log", line=r.line[:500])
            for r in ctx.store.logs(entity=entity, contains=text, limit=limit)
        )
        hits.sort(key=lambda h: h.ts or 0.0, reverse=True)
        return LogSearch(matches=len(hits), results=hits[:limit])

    for analysis_tool in Analysis(ctx).tools():
        tool(analysis_tool)

    if allow_writes:

        @tool
        def propose_action(kind: str, target: str, reason: str, incident_id: str | None = None) -> Action:
            """Propose a whitelisted action (cordon, drain, reset_gpu, ...); a person or the REST API approves
            and executes it."""
            try:
                action_kind = ActionKind(kind)
            except ValueError:
                raise VigilInputError(
                    f"action {kind!r} is not on the whitelist: {', '.join(k.value for k in ActionKind)}"
                ) from None
            parse_entity(target)
            action = Action(
                ts=time.time(),
                kind=action_kind,
                target=target,
                incident_id=incident_id,
                reason=reason[:2000],
                requested_by=mcp_identity().name,
            )
            ctx.store.add_action(action)
            return action

        @tool
        def approve_action(action_id: str) -> Action:
            """Approve a proposed action (execute_action then runs it); the two-person rule of the REST API."""
            return approve(ctx, action_id, mcp_identity())

        @tool
        def execute_action(action_id: str, dry_run: bool = True) -> Action:
            """Run an approved action through this server's remedy back end (`vigil mcp --actuator`, else the
            setting remedy_backend), behind the blast-radius guard and the audit log, as the REST API's execute
            does; the action records the verdict. dry_run=true (the default) calls no back end and changes
            nothing: the action (proposed or approved) comes back as it is, its result saying what a real run would
            do now or why the guard would refuse it, params.dry_run_status the status it would get. dry_run=false
            needs execute_actions on."""
            return execute(ctx, action_id, mcp_identity(), dry_run=dry_run)

    return server
