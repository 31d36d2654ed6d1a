"""Experiment runs over HTTP: the TensorBoard index's runs, and any runs compared on one tag.

The index is the one `vigil runs index` writes under the Vigil home; the server only reads it, so many users
share one set of parsed scalars. Each series is downsampled on the server (bucket minimum and maximum, so
spikes stay) before it is sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from vigil.faces.api.auth import check_page, check_read
from vigil.model import VigilInputError
from vigil.sources.tensorboard import RunIndex

router = APIRouter(tags=["runs"])


class RunSummary(BaseModel):
    name: str
    tags: list[str]
    points: int
    merged_from: list[str] | None


class RunSeries(BaseModel):
    run: str
    tag: str
    x: list[float]
    steps: list[int]
    values: list[float | None]


class RunComparison(BaseModel):
    tag: str
    align: Literal["step", "time"]
    series: list[RunSeries]


def _open(request: Request) -> RunIndex:
    """The server's one open index (the file `vigil runs index` writes under the configured home)."""
    index: RunIndex | None = getattr(request.app.state, "run_index", None)
    if index is None:
        path: Path = request.app.state.ctx.settings.home / "runs.sqlite"
        if not path.is_file():
            raise HTTPException(status.HTTP_404_NOT_FOUND, "no runs indexed yet: run `vigil runs index LOGDIR`")
        index = RunIndex(path)
        request.app.state.run_index = index
    return index


@router.get("/api/v1/runs", response_model=list[RunSummary], dependencies=[Depends(check_read)])
def list_runs(request: Request) -> list[RunSummary]:
    """Every indexed run and merged run."""
    index = _open(request)
    with index.lock:
        infos = index.runs()
    return [RunSummary(name=i.name, tags=i.tags, points=i.points, merged_from=i.merged_from) for i in infos]


@router.get("/api/v1/runs/scalars", response_model=RunComparison, dependencies=[Depends(check_read)])
async def compare_runs(
    request: Request,
    run: Annotated[list[str], Query(min_length=1, max_length=50, description="runs to compare")],
    tag: Annotated[str, Query(min_length=1, max_length=500)],
    align: Literal["step", "time"] = "step",
    points: Annotated[int, Query(ge=2, le=20_000)] = 1000,
) -> RunComparison:
    """One tag of several runs, aligned by step or by seconds since each run's start."""
    index = _open(request)
    try:
        compared = await run_in_threadpool(index.compare_locked, run, tag, align, points)
    except VigilInputError as err:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(err)) from None
    return RunComparison(
        tag=tag,
        align=align,
        series=[
            RunSeries(
                run=s.run,
                tag=s.tag,
                x=x.tolist(),
                steps=s.steps.tolist(),
                values=[None if v != v else float(v) for v in s.values.tolist()],
            )
            for s, x in compared
        ],
    )


@router.get("/runs", response_class=HTMLResponse, include_in_schema=False, dependencies=[Depends(check_page)])
def runs_page(request: Request) -> HTMLResponse:
    from vigil.faces.api.dashboard import templates

    return templates.TemplateResponse(request, "runs.html", {})
