"""`vigil tide plan`: how many GPUs spot training and offline inference may hold over the coming intervals,
from an inference request trace and the tier policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vigil.faces.cli.output import DataTable, SafeConsole
from vigil.model import VigilInputError

app = typer.Typer(
    help="Tidal planning: lend serving capacity to spot training and offline inference.", no_args_is_help=True
)
console = SafeConsole()


@app.command("plan")
def plan_command(
    trace: Annotated[Path, typer.Option("--trace", help="request trace CSV with a TIMESTAMP column")],
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs in the cluster")] = 1000,
    unhealthy_gpus: Annotated[
        int, typer.Option("--unhealthy-gpus", min=0, help="GPUs on nodes below healthy: never offered")
    ] = 0,
    from_store: Annotated[
        bool,
        typer.Option("--from-store", help="take the GPUs and the nodes below healthy from the store's topology"),
    ] = False,
    policy: Annotated[Path | None, typer.Option("--policy", help="tier policy YAML (default: the shipped one)")] = None,
    horizon: Annotated[int | None, typer.Option("--horizon", min=1, help="intervals to plan")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Forecast the trace's inference load and allot each tier its GPUs per interval, with preemption notices."""
    from vigil.remedy.tide.load import peak_rates, read_request_times
    from vigil.remedy.tide.planner import Capacity, capacity_of, plan
    from vigil.remedy.tide.tiers import load_tier_policy

    tiers = load_tier_policy(policy)
    if unhealthy_gpus > gpus:
        raise VigilInputError(f"--unhealthy-gpus {unhealthy_gpus} exceeds --gpus {gpus}")
    capacity = Capacity(gpus, unhealthy_gpus)
    if from_store:
        from vigil.config import settings
        from vigil.store.sql import open_store, store_exists

        if not store_exists(settings().database_url()):
            raise VigilInputError(f"nothing stored under {settings().home}: run `vigil demo` or `vigil serve` first")
        store = open_store()
        try:
            topology, health = store.topology(), store.node_health()
        finally:
            store.close()
        if topology is None or not any(node.gpus for node in topology.nodes):
            raise VigilInputError("the stored topology has no GPUs")
        capacity = capacity_of(topology, health)
    history = peak_rates(read_request_times(trace), tiers.interval_s)
    result = plan(history, tiers, capacity, horizon)
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    table = DataTable(title=f"Tidal plan: {result.healthy_gpus} healthy GPUs, {tiers.interval_s:g} s intervals")
    for column in ("starts in", "forecast req/s", "1 inference", "2 training", "3 spot", "4 offline"):
        table.add_column(column, justify="right")
    for row in result.intervals:
        table.add_row(
            f"{row.start_s:g} s",
            f"{row.forecast_rps:.1f}",
            f"{row.tiers[1]}" + (f" (short {row.shortfall})" if row.shortfall else ""),
            *(str(row.tiers[n]) for n in (2, 3, 4)),
        )
    console.print(table)
    for notice in result.notices:
        console.print(
            f"notice at +{notice.issued_s:g} s: tier {notice.tier} gives back {notice.gpus} GPUs"
            f" by +{notice.effective_s:g} s"
        )
