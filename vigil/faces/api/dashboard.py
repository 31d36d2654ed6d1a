"""The web dashboard: server-rendered pages (Jinja2 + inline SVG), assets shipped in the package."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from vigil.faces.api import cluster_map, svg
from vigil.faces.api.auth import SignInRequired, check_page
from vigil.faces.api.context import ServeContext
from vigil.faces.api.hang import load_hang_report, stack_tree
from vigil.faces.verdicts import verdict_text
from vigil.model import Action, Diagnosis, Evidence, FaultLevel, Incident, IncidentStatus, VigilInputError, parse_entity
from vigil.remedy.guard import CAPACITY_ACTIONS, BlastRadiusGuard
from vigil.remedy.lifecycle import NodeState

router = APIRouter(include_in_schema=False, dependencies=[Depends(check_page)])
templates = Jinja2Templates(directory=str(resources.files("vigil.faces.api") / "templates"))
templates.env.globals["level_name"] = lambda level: FaultLevel(int(level)).label
templates.env.globals["level_color"] = lambda level: svg.LEVEL_COLORS[int(level)]
templates.env.globals["entity_url"] = lambda entity: _entity_url(str(entity))
templates.env.filters["verdict"] = verdict_text
templates.env.filters["utc"] = lambda ts: datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S")


def _entity_url(entity: str) -> str:
    """The page that shows an entity: a GPU's own page, a node's for its NICs, a job's for its ranks."""
    kind, _, rest = entity.partition("/")
    parts = rest.split("/")
    if kind == "gpu" and len(parts) == 2:
        return f"/gpus/{parts[0]}/{parts[1]}"
    if kind in ("node", "nic"):
        return f"/nodes/{parts[0]}"
    if kind == "job":
        return f"/jobs/{parts[0]}"
    return ""


def _ctx(request: Request) -> ServeContext:
    return request.app.state.ctx


def _page(request: Request, name: str, **values: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, values)


def sign_in_page(request: Request, err: SignInRequired) -> HTMLResponse:
    """What a page asked for without a good token answers: the reason and a sign-in form."""
    return templates.TemplateResponse(request, "sign_in.html", {"reason": err.reason}, status_code=err.status_code)


@router.get("/", response_class=HTMLResponse)
def overview(request: Request) -> HTMLResponse:
    """A light page: the heat map is drawn in the browser from /api/v1/cluster/map, fetched alongside."""
    ctx = _ctx(request)
    source = cluster_map.source_of(request)
    newest = ctx.store.incidents(status=IncidentStatus.OPEN, limit=20)
    return _page(
        request,
        "overview.html",
        incidents=newest,
        open_total=len(source.open_incidents()),
        hangs=sorted(ctx.hang_reports()),
        jobs=source.jobs(),
        waste=_waste_rows(ctx),
        waste_window_s=ctx.waste_window_s,
    )


@router.get("/ask", response_class=HTMLResponse)
def ask_page(request: Request) -> HTMLResponse:
    """The chat panel: questions go to /api/v1/agent/run, the answer and each tool step stream back as AG-UI
    events (static/ask.js)."""
    from vigil.faces.api.ask.planner import flows

    return _page(request, "ask.html", examples=[q for f in flows() for q in f.examples[:1]])


def _waste_rows(ctx: ServeContext) -> list[Any]:
    report = ctx.waste()
    return report.summary("job") if report is not None else []


@router.get("/incidents", response_class=HTMLResponse)
def incident_list(request: Request) -> HTMLResponse:
    ctx = _ctx(request)
    return _page(request, "incidents.html", incidents=ctx.store.incidents(limit=1000))


MAX_PLOTS = 8


def _moved(ts: np.ndarray, values: np.ndarray, start: float) -> bool:
    """Whether a series moved at ``start``: its median after differs from its median before by more than
    three spreads of the before (a display filter for the plots, not a detector)."""
    before, after = values[(ts < start) & np.isfinite(values)], values[(ts >= start) & np.isfinite(values)]
    if len(before) < 3 or not len(after):
        return False
    shift = abs(float(np.median(after)) - float(np.median(before)))
    return shift > max(3 * float(np.std(before)), 0.05 * abs(float(np.median(before))), 1e-9)


def _plots(ctx: ServeContext, incident: Incident, named: list[tuple[str, str]]) -> list[Markup]:
    """Small plots around the incident, its span shaded: first the series its evidence names, then the GPU
    and node metrics of its entities that moved when it started."""
    pad = max(incident.end - incident.start, 300.0)
    candidates = list(named)
    for entity in incident.entities:
        kind = entity.split("/", 1)[0]
        metrics = GPU_PLOTS if kind == "gpu" else NODE_PLOTS if kind == "node" else ()
        candidates.extend((entity, metric) for metric in metrics if (entity, metric) not in named)
    plots = []
    for entity, metric in candidates:
        try:
            ts, values = ctx.series(entity, metric, incident.start - pad, incident.end + pad)
        except VigilInputError:
            continue
        if len(ts) and ((entity, metric) in named or _moved(ts, values, incident.start)):
            plots.append(Markup(svg.spark(ts.tolist(), values.tolist(), metric, entity, incident.start, incident.end)))
        if len(plots) == MAX_PLOTS:
            break
    return plots


def _guard_verdicts(ctx: ServeContext, diagnosis: Diagnosis | None) -> list[str]:
    """What the blast-radius guard would say to each plan step now, in order, as if the earlier steps ran:
    a fresh guard over the stored lifecycle, so asking changes nothing."""
    if diagnosis is None:
        return []
    guard = BlastRadiusGuard(
        ctx.topology(),
        ctx.lifecycle,
        max_share=ctx.settings.max_cordon_share,
        max_share_per_switch=ctx.settings.max_cordon_share_per_switch,
    )
    verdicts = []
    for step in diagnosis.plan:
        if step.action not in CAPACITY_ACTIONS:
            verdicts.append("admitted: takes no capacity out of service")
            continue
        kind, parts = parse_entity(step.target)
        if kind not in ("node", "gpu", "nic"):
            verdicts.append(f"refused: {step.target} is not on a node; blast radius cannot be judged")
            continue
        verdict = guard.admit(f"node/{parts[0]}")
        verdicts.append(f"{'admitted' if verdict.admitted else 'refused'}: {verdict.reason}")
    return verdicts


def _last_dry_runs(ctx: ServeContext, actions: list[Action]) -> dict[str, Action]:
    """Each action's last dry run, by the action's id, from the audit log: a dry run writes nothing to the action
    (vigil.faces.api.actions), its audit record names the action in ``params.dry_run_of``."""
    if ctx.remediator is None:
        return {}
    ids = {a.id for a in actions}
    last: dict[str, Action] = {}
    for target in {a.target for a in actions}:
        for record in ctx.remediator.audit.actions(target=target):  # oldest first: the last one stays
            tried = record.params.get("dry_run_of")
            if tried in ids:
                last[tried] = record
    return last


@router.get("/incidents/{incident_id}", response_class=HTMLResponse)
def incident_detail(request: Request, incident_id: str) -> HTMLResponse:
    ctx = _ctx(request)
    incident = ctx.store.incident(incident_id)
    if incident is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no incident {incident_id!r}")
    diagnosis = ctx.store.diagnosis(incident_id)
    # The engine stores a diagnosis when it opens an incident; one stored without it is diagnosed by the server's
    # background threads (vigil.faces.api.diagnosing), never here: the page says so and refreshes its panels
    # (as it does while a rerun asked for with Diagnose again runs beside the stored diagnosis).
    state = ctx.diagnosis_status(incident_id)
    if state.pending and diagnosis is None:
        ctx.diagnoser.want(incident_id)
    actions = ctx.store.actions(incident_id=incident_id, limit=200)
    evidence: list[Evidence] = sorted(incident.evidence, key=lambda e: e.ts)
    by_ref = {e.ref: e for e in evidence}
    # The metrics that moved: those the incident's evidence names, then those behind its anomalies.
    wanted = set(incident.anomalies)
    anomalies = [a for entity in incident.entities for a in ctx.store.anomalies(entity=entity) if a.id in wanted]
    moved = list(
        dict.fromkeys(
            (e.entity, e.metric) for e in [*evidence, *(ev for a in anomalies for ev in a.evidence)] if e.metric
        )
    )
    timeline = svg.evidence_timeline(evidence, incident.start, incident.end)
    # Who acknowledged or resolved it: the store records each status change as an event on the scope.
    status_changes = [
        e
        for e in ctx.store.events(entity=incident.scope, kind="incident_status", limit=10_000)
        if e.attrs.get("incident_id") == incident.id
    ]
    return _page(
        request,
        "incident.html",
        status_changes=status_changes,
        incident=incident,
        diagnosis=diagnosis,
        diagnosis_state=state.state,
        diagnosis_error=state.error,
        diagnosis_status=state,
        by_ref=by_ref,
        actions=actions,
        dry_runs=_last_dry_runs(ctx, actions),
        timeline=Markup(timeline),
        plots=_plots(ctx, incident, moved),
        verdicts=_guard_verdicts(ctx, diagnosis),
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


TIMELINE_FILE = "timeline.json"  # the Chrome trace `vigil launch` writes beside its diagnosis.json


def _run_view(name: str, path: Path) -> dict[str, Any]:
    """What the run partial shows of one launch run: verdict, stack tree with its fork point, ring, ranks."""
    report = load_hang_report(path)
    return {
        "report": report,
        "tree": stack_tree(report.stacks, report.fork_point),
        # Past a few dozen ranks a ring drawing is a blur; the rank table says the same.
        "ring": Markup(svg.ring(report.world_size, report.culprit_links, report.culprit_ranks))
        if report.world_size <= 64
        else None,
        "timeline": f"/hangs/{name}/{TIMELINE_FILE}" if (path.parent / TIMELINE_FILE).is_file() else "",
    }


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
    levels = {g["id"]: g["level"] for row in ctx.node_grid() for g in row["gpus"]}
    placement = [
        {"rank": rank, "gpu": gpu, "node": gpu.split("/")[1], "level": levels.get(gpu, 0)}
        for rank, gpu in enumerate(data["job"]["placement"])
    ]
    slowest = None
    if len(medians) > 1:
        ordered = sorted(medians.values())
        rank = max(medians, key=lambda r: medians[r])
        slowest = {"rank": rank, "median": medians[rank], "ratio": medians[rank] / ordered[len(ordered) // 2]}
    run = None
    for name, path in sorted(ctx.hang_reports().items()):
        try:
            if load_hang_report(path).raw.get("job") == job:
                run = {"name": name, **_run_view(name, path)}
                break
        except VigilInputError:
            continue
    rank_rows = {}
    if run is not None:
        rank_rows = {r["rank"]: r for r in run["report"].raw.get("ranks") or [] if isinstance(r, dict) and "rank" in r}
    return _page(
        request,
        "job.html",
        job=data["job"],
        chart=Markup(chart),
        medians=medians,
        job_level=job_level,
        placement=placement,
        nodes=len({p["node"] for p in placement}),
        slowest=slowest,
        run=run,
        rank_rows=rank_rows,
    )


@router.get("/hangs/{name}", response_class=HTMLResponse)
def hang_view(request: Request, name: str) -> HTMLResponse:
    ctx = _ctx(request)
    path = ctx.hang_reports().get(name)
    if path is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no launch run {name!r}")
    return _page(request, "hang.html", **_run_view(name, path))


@router.get(f"/hangs/{{name}}/{TIMELINE_FILE}")
def hang_timeline(request: Request, name: str) -> FileResponse:
    """The run's op timeline as a Chrome trace, for ui.perfetto.dev or chrome://tracing."""
    path = _ctx(request).hang_reports().get(name)
    if path is None or not (path.parent / TIMELINE_FILE).is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no op timeline for launch run {name!r}")
    return FileResponse(path.parent / TIMELINE_FILE, media_type="application/json", filename=f"{name}-timeline.json")


# What a GPU's and a node's pages plot (names from the metric catalogue, vigil/knowledge/data/metrics.yaml);
# a series the metrics source does not hold is left out.
GPU_PLOTS = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
)
NODE_PLOTS = (
    "vigil_node_up",
    "vigil_node_cpu_utilization_ratio",
    "vigil_node_memory_used_bytes",
    "vigil_node_load1",
    "vigil_node_fan_speed_min_rpm",
    "vigil_node_psu_ok",
)


def _touching(request: Request, entities: set[str]) -> list[Incident]:
    """Every stored incident on any of ``entities``, newest first (open and resolved: the entity's history)."""
    return [i for i in cluster_map.source_of(request).incidents() if entities.intersection(i.entities)]


def _history_plots(ctx: ServeContext, entity: str, metrics: tuple[str, ...], incidents: list[Incident]) -> list[Markup]:
    """The whole stored series of each metric, the newest incident's span shaded."""
    newest = incidents[0] if incidents else None
    plots = []
    for metric in metrics:
        try:
            ts, values = ctx.series(entity, metric)
        except VigilInputError:
            continue
        if len(ts):
            start, end = (newest.start, newest.end) if newest else (float(ts[-1]), float(ts[-1]))
            plots.append(Markup(svg.spark(ts.tolist(), values.tolist(), metric, entity, start, end)))
    return plots


@router.get("/nodes/{name}", response_class=HTMLResponse)
def node_view(request: Request, name: str) -> HTMLResponse:
    ctx = _ctx(request)
    try:
        data = ctx.node_lifecycle(name)
    except KeyError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no node {name!r}") from None
    grid = [row for row in ctx.node_grid() if row["name"] == name]
    node = ctx.topology().node(name)
    incidents = _touching(request, {node.id, *(g.id for g in node.gpus), *(n.id for n in node.nics)})
    return _page(
        request,
        "node.html",
        data=data,
        stages=[state.value for state in NodeState],
        heat_map=Markup(svg.heat_map(grid, cell=26)),
        gpus=grid[0]["gpus"] if grid else [],
        incidents=incidents,
        plots=_history_plots(ctx, node.id, NODE_PLOTS, incidents),
    )


@router.get("/gpus/{node}/{index}", response_class=HTMLResponse)
def gpu_view(request: Request, node: str, index: int) -> HTMLResponse:
    ctx = _ctx(request)
    row = next((r for r in ctx.node_grid() if r["name"] == node), None)
    gpu = next((g for g in row["gpus"] if g["index"] == index), None) if row else None
    if row is None or gpu is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no GPU gpu/{node}/{index}")
    entity = gpu["id"]
    incidents = _touching(request, {entity})
    jobs = [
        (job.id, rank) for job in ctx.topology().jobs for rank, placed in enumerate(job.placement) if placed == entity
    ]
    return _page(
        request,
        "gpu.html",
        node=row,
        gpu=gpu,
        jobs=jobs,
        incidents=incidents,
        events=ctx.store.events(entity=entity, limit=200)[-50:],
        plots=_history_plots(ctx, entity, GPU_PLOTS, incidents),
    )
