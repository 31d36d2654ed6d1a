"""The web dashboard: server-rendered pages (Jinja2 + inline SVG), assets shipped in the package."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from typing import Any

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from vigil.faces.api import svg
from vigil.faces.api.context import ServeContext
from vigil.faces.api.hang import load_hang_report, stack_tree
from vigil.model import Evidence, FaultLevel, IncidentStatus, VigilInputError
from vigil.remedy.lifecycle import NodeState

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(resources.files("vigil.faces.api") / "templates"))
templates.env.globals["level_name"] = lambda level: FaultLevel(int(level)).label
templates.env.globals["level_color"] = lambda level: svg.LEVEL_COLORS[int(level)]
templates.env.filters["utc"] = lambda ts: datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ctx(request: Request) -> ServeContext:
    return request.app.state.ctx


def _page(request: Request, name: str, **values: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, values)


@router.get("/", response_class=HTMLResponse)
def overview(request: Request) -> HTMLResponse:
    ctx = _ctx(request)
    grid = ctx.node_grid()
    open_incidents = [i for i in ctx.store.incidents(limit=500) if i.status is not IncidentStatus.RESOLVED]
    counts = {level.label: 0 for level in FaultLevel}
    for row in grid:
        for gpu in row["gpus"]:
            counts[FaultLevel(gpu["level"]).label] += 1
    return _page(
        request,
        "overview.html",
        heat_map=Markup(svg.heat_map(grid)),
        incidents=open_incidents[:20],
        counts=counts,
        nodes=len(grid),
        hangs=sorted(ctx.hang_reports()),
        jobs=ctx.topology().jobs,
    )


@router.get("/incidents", response_class=HTMLResponse)
def incident_list(request: Request) -> HTMLResponse:
    ctx = _ctx(request)
    return _page(request, "incidents.html", incidents=ctx.store.incidents(limit=1000))


@router.get("/incidents/{incident_id}", response_class=HTMLResponse)
def incident_detail(request: Request, incident_id: str) -> HTMLResponse:
    ctx = _ctx(request)
    incident = ctx.store.incident(incident_id)
    if incident is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no incident {incident_id!r}")
    diagnosis = ctx.store.diagnosis(incident_id)
    actions = ctx.store.actions(incident_id=incident_id, limit=200)
    evidence: list[Evidence] = list(incident.evidence)
    series = None
    metric_ev = next((e for e in evidence if e.kind == "metric" and e.metric), None)
    if metric_ev is not None and metric_ev.metric is not None:
        span = max(incident.end - incident.start, 60.0)
        try:
            ts, values = ctx.series(metric_ev.entity, metric_ev.metric, incident.start - span, incident.end + span)
            series = (
                ts.tolist(),
                [None if v != v else float(v) for v in values],
                f"{metric_ev.metric} {metric_ev.entity}",
            )
        except VigilInputError:
            series = None
    timeline = svg.evidence_timeline(evidence, incident.start, incident.end, series)
    return _page(
        request,
        "incident.html",
        incident=incident,
        diagnosis=diagnosis,
        actions=actions,
        timeline=Markup(timeline),
    )


def _type_of(info: dict[str, Any]) -> str:
    """A JSON-schema fragment as one short type name: ``list[Evidence]``, ``str | null``, ``FaultLevel``."""
    if "$ref" in info:
        return str(info["$ref"]).rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in info:
            return " | ".join(_type_of(part) for part in info[key])
    kind = info.get("type", "any")
    if kind == "array":
        return f"list[{_type_of(info.get('items', {}))}]"
    if kind == "object" and "additionalProperties" in info:
        extra = info["additionalProperties"]
        return f"dict[str, {_type_of(extra) if isinstance(extra, dict) else 'any'}]"
    return str(kind)


templates.env.globals["type_of"] = _type_of


@router.get("/docs", response_class=HTMLResponse)
def api_docs(request: Request) -> HTMLResponse:
    """The OpenAPI document as a page served from the package: no Swagger UI from a CDN, so it works on an
    air-gapped cluster too."""
    spec = request.app.openapi()
    groups: dict[str, list[dict[str, Any]]] = {}
    for path, methods in spec.get("paths", {}).items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            ok: dict[str, Any] = next((r for code, r in op.get("responses", {}).items() if code.startswith("2")), {})
            returns = ok.get("content", {}).get("application/json", {}).get("schema", {})
            groups.setdefault((op.get("tags") or ["other"])[0], []).append(
                {
                    "id": op.get("operationId", ""),
                    "method": method,
                    "path": path,
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "params": [
                        {
                            "name": p["name"],
                            "in": p["in"],
                            "required": p.get("required", False),
                            "type": _type_of(p.get("schema", {})),
                        }
                        for p in op.get("parameters", [])
                    ],
                    "writes": method != "get",  # every mutating route needs the bearer token
                    "body": _type_of(body) if body else "",
                    "returns": _type_of(returns) if "$ref" in returns else "",
                }
            )
    schemas = sorted(spec.get("components", {}).get("schemas", {}).items())
    return _page(request, "api_docs.html", spec=spec, groups=sorted(groups.items()), schemas=schemas)


@router.get("/jobs/{job}", response_class=HTMLResponse)
def job_view(request: Request, job: str) -> HTMLResponse:
    ctx = _ctx(request)
    try:
        data = ctx.job_step_times(job)
    except KeyError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job!r}") from None
    medians = {}
    for rank, series in data["ranks"].items():
        values = sorted(v for v in series["values"] if v is not None)
        if values:
            medians[rank] = values[len(values) // 2]
    # Without per-rank reports (the training probe sends them) the job's own step time is still worth a look.
    job_level = not data["ranks"] and any(v is not None for v in data["job_series"]["values"])
    chart = svg.step_time_chart({0: data["job_series"]} if job_level else data["ranks"])
    return _page(request, "job.html", job=data["job"], chart=Markup(chart), medians=medians, job_level=job_level)


@router.get("/hangs/{name}", response_class=HTMLResponse)
def hang_view(request: Request, name: str) -> HTMLResponse:
    ctx = _ctx(request)
    path = ctx.hang_reports().get(name)
    if path is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no launch run {name!r}")
    report = load_hang_report(path)
    tree = stack_tree(report.stacks, report.fork_point)
    return _page(
        request,
        "hang.html",
        report=report,
        tree=tree,
        ring=Markup(svg.ring(report.world_size, report.culprit_links, report.culprit_ranks)),
    )


@router.get("/nodes/{name}", response_class=HTMLResponse)
def node_view(request: Request, name: str) -> HTMLResponse:
    ctx = _ctx(request)
    try:
        data = ctx.node_lifecycle(name)
    except KeyError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no node {name!r}") from None
    grid = [row for row in ctx.node_grid() if row["name"] == name]
    return _page(
        request,
        "node.html",
        data=data,
        stages=[state.value for state in NodeState],
        heat_map=Markup(svg.heat_map(grid, cell=26)),
    )
