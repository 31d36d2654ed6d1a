"""The FastAPI application: REST API, dashboard, /metrics, Alertmanager webhook, simulated dcgm-exporter."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST

from vigil import __version__
from vigil.config import Settings
from vigil.config import settings as default_settings
from vigil.faces.api import a2a, api, chat, cluster_map, dashboard, ingest, runs
from vigil.faces.api.actions import ActionRefused
from vigil.faces.api.auth import SignInRequired
from vigil.faces.api.context import ServeContext
from vigil.faces.api.dcgm import CONTENT_TYPE as DCGM_CONTENT_TYPE
from vigil.faces.api.dcgm import render_dcgm
from vigil.faces.api.exporter import render_metrics
from vigil.model import IdempotencyKeyReused, VigilConflictError, VigilInputError
from vigil.remedy.lifecycle import LifecycleStore
from vigil.sources.promql import PromQLSource
from vigil.store.metrics import MetricFrame, MetricStore

if TYPE_CHECKING:
    from vigil.remedy.remediator import Remediator
    from vigil.store.sql import Store


# The first errors a 422 describes (loc, msg, type); every refused item of a list body is named in its
# ``invalid_indices`` however many errors there are, so that a sender drops them all at once.
MAX_LISTED_ERRORS = 20


def _invalid_items(err: RequestValidationError) -> list[int]:
    """The indices of a list body's items that failed validation (errors at ``["body", index, ...]``), sorted, each
    once: at most one a body item, so no longer than the list sent (the events route takes 10,000)."""
    return sorted({loc[1] for e in err.errors() if len(loc := tuple(e.get("loc", ()))) >= 2 and loc[0] == "body"
                   and isinstance(loc[1], int) and not isinstance(loc[1], bool)})


def _one_line_validation(err: RequestValidationError) -> str:
    parts = []
    for item in err.errors()[:5]:
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {item.get('msg', 'invalid')}")
    return "; ".join(parts)


def create_app(
    store: Store,
    metrics: MetricStore | None = None,
    settings: Settings | None = None,
    *,
    prom: PromQLSource | None = None,
    launch_dirs: list[Path] | None = None,
    remediator: Remediator | None = None,
    lifecycle: LifecycleStore | None = None,
) -> FastAPI:
    """Build the server over a Store (events, incidents, actions, topology) and a metrics source: the
    embedded MetricStore, or ``prom`` (a PromQLSource) for an existing Prometheus / VictoriaMetrics."""
    ctx = ServeContext(
        store=store,
        settings=settings or default_settings(),
        metrics=metrics,
        prom=prom,
        launch_dirs=list(launch_dirs or []),
        remediator=remediator,
        lifecycle=lifecycle,
    )
    return app_for_context(ctx)


def app_for_context(ctx: ServeContext) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Incidents stored without a diagnosis, those left from before this start included, are diagnosed by
        # the server's own threads from now on (vigil.faces.api.diagnosing), never inside a request.
        ctx.diagnoser.start()
        try:
            yield
        finally:
            ctx.diagnoser.stop(wait_s=1.0)  # a diagnosis under way is left to its lease: no exit waits 15 s

    app = FastAPI(
        lifespan=lifespan,
        docs_url=None,  # /docs is served from the package (dashboard.api_docs), not Swagger UI from a CDN
        redoc_url=None,
        title="Vigil",
        version=__version__,
        description="Observe, detect, localize, diagnose and remedy faults on AI training clusters. "
        "With users or a token configured every route needs 'Authorization: Bearer <token>' (reads: any "
        "user; writes: operator or above; approvals: approver, not the proposer).",
    )
    app.state.ctx = ctx
    app.state.cluster_map = cluster_map.ClusterMapSource(ctx)
    # Parse the topology and incidents now, not on the first visitor's clock (about 0.4 s at 10,000 GPUs).
    app.state.cluster_map.build()
    # The GPU waste report reads every allocated GPU's series: its first computation starts now, beside.
    threading.Thread(target=ctx.waste, name="vigil-waste-first", daemon=True).start()

    @app.exception_handler(VigilInputError)
    async def _bad_input(request: Request, err: VigilInputError) -> JSONResponse:
        if isinstance(err, ActionRefused):
            return JSONResponse({"detail": str(err)}, status_code=err.status_code)
        if isinstance(err, IdempotencyKeyReused):
            return JSONResponse({"detail": str(err)}, status_code=422)
        return JSONResponse({"detail": str(err)}, status_code=409 if isinstance(err, VigilConflictError) else 400)

    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, err: SignInRequired) -> HTMLResponse:
        return dashboard.sign_in_page(request, err)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {
                "detail": f"invalid request: {_one_line_validation(err)}",
                "errors": [{k: e[k] for k in ("loc", "msg", "type") if k in e}
                           for e in err.errors()[:MAX_LISTED_ERRORS]],
                "invalid_indices": _invalid_items(err),
            },
            status_code=422,
        )

    @app.get("/metrics", include_in_schema=False)
    def metrics_endpoint() -> Response:
        return Response(render_metrics(ctx.collector), media_type=CONTENT_TYPE_LATEST)

    @app.get("/sim/dcgm/metrics", include_in_schema=False)
    def simulated_dcgm_exporter() -> Response:
        """The latest ``gpu`` frame of the embedded store, as a dcgm-exporter on every node would print it."""
        if ctx.metrics is None or "gpu" not in ctx.metrics.families():
            return PlainTextResponse("no simulated GPU frames loaded\n", status_code=404)
        ts, values = ctx.metrics.window("gpu", 1)
        frame = MetricFrame(
            ts=float(ts[-1]),
            family="gpu",
            entities=ctx.metrics.entities("gpu"),
            metrics=ctx.metrics.metrics("gpu"),
            values=values[-1],
        )
        return Response(render_dcgm(frame, ctx.topology()), media_type=DCGM_CONTENT_TYPE)

    app.include_router(api.meta)
    app.include_router(api.router)
    app.state.a2a_tasks = a2a.TaskBook()
    app.include_router(a2a.card_router)
    app.include_router(a2a.router)
    app.include_router(chat.router)
    app.include_router(cluster_map.router)
    app.include_router(ingest.router)
    app.include_router(dashboard.router)
    app.include_router(runs.router)
    static_dir = resources.files("vigil.faces.api") / "static"
    app.mount("/static", StaticFiles(directory=str(static_dir)), name="static")
    return app
