"""`vigil waste`: allocated against used GPUs per job or machine, and the GPUs that sit idle."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

import typer

from vigil.config import settings
from vigil.faces.cli.output import DataTable, SafeConsole, json_text
from vigil.model import VigilInputError

if TYPE_CHECKING:
    from vigil.model import Topology
    from vigil.store.metrics import MetricStore

console = SafeConsole()


def stored_allocation() -> tuple[Topology, MetricStore, tuple[float, float]]:
    """The stored topology (with jobs), the GPU metric store and its time span; one line if any is missing."""
    from vigil.detect.waste import window_of
    from vigil.store.metrics import MetricStore
    from vigil.store.sql import open_store, store_exists

    home = settings().home
    if not store_exists(settings().database_url()) or not (home / "metrics").is_dir():
        raise VigilInputError(f"nothing stored under {home}: run `vigil demo` or `vigil serve` with agents first")
    store = open_store()
    try:
        topology = store.topology()
    finally:
        store.close()
    if topology is None or not topology.jobs:
        raise VigilInputError("no jobs in the stored topology: nothing is allocated")
    metrics = MetricStore(home / "metrics")
    span = window_of(metrics)
    if span is None:
        raise VigilInputError(f"no GPU metrics stored under {home / 'metrics'}")
    return topology, metrics, span


def waste(
    window: Annotated[float, typer.Option("--window", min=1.0, help="seconds up to the last scrape")] = 3600.0,
    by: Annotated[str, typer.Option("--by", help="job or node")] = "job",
    idle_activity: Annotated[
        float, typer.Option("--idle-activity", min=0.0, max=1.0, help="a GPU below this all window is idle")
    ] = 0.05,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """GPU waste rate (1 - mean activity of allocated GPUs) per job or node, most wasteful first, with idle GPUs.

    Activity is DCGM's graphics-engine-active ratio when profiled, else GPU utilization; allocation is the
    jobs' placement in the store's topology.
    """
    from vigil.detect.waste import gpu_waste

    if by not in ("job", "node"):
        raise VigilInputError(f"--by must be job or node, not {by!r}")
    topology, metrics, span = stored_allocation()
    start, end = max(span[0], span[1] - window), span[1]
    if end <= start:
        start = end - 1.0
    report = gpu_waste(metrics, topology, start, end, idle_activity=idle_activity)
    rows = report.summary(by)
    if as_json:
        payload = {"start": start, "end": end, "by": by, "rows": [dataclasses.asdict(r) for r in rows]}
        typer.echo(json_text(payload, indent=2))
        return
    table = DataTable(title=f"GPU waste by {by}, last {end - start:.0f} s of metrics")
    table.add_column(by, no_wrap=True)
    for column in ("allocated", "measured", "mean activity", "waste rate", "idle GPUs"):
        table.add_column(column, justify="right" if column != "idle GPUs" else "left", overflow="fold")
    for row in rows:
        table.add_row(
            row.name,
            str(row.allocated_gpus),
            str(row.measured_gpus),
            "-" if row.mean_activity is None else f"{row.mean_activity:.1%}",
            "-" if row.waste_rate is None else f"{row.waste_rate:.1%}",
            ", ".join(row.idle_gpus) or "-",
        )
    allocated = sum(r.allocated_gpus for r in rows)
    idle_total = sum(len(r.idle_gpus) for r in rows)
    table.set_caption(f"{allocated} allocated GPUs, {idle_total} idle for the whole window")
    console.print(table)
