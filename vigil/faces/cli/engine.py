"""`vigil engine`: the live loop as its own process (for scale; `vigil serve` runs one by default)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from vigil.faces.cli.core import is_demo_store
from vigil.faces.cli.stopping import closed_at_exit, run_stoppable
from vigil.model import VigilInputError


def engine(
    config: Annotated[Path | None, typer.Option("--config", help="settings YAML file (else VIGIL_* env)")] = None,
    once: Annotated[bool, typer.Option("--once", help="one tick, print what it did, exit")] = False,
    actuator: Annotated[
        str | None,
        typer.Option(help="none, kubernetes or slurm: the back end whose half-done actions a killed engine or "
                     "server left are finished at start (with execute_actions on; off, nothing is executed). "
                     "Default: the setting remedy_backend (VIGIL_REMEDY_BACKEND, or remedy_backend: in the "
                     "--config file), else none"),
    ] = None,
    on_demo_store: Annotated[
        bool, typer.Option("--on-demo-store", help="run even on a store `vigil demo` wrote (its incidents would be "
                           "opened again and resolved by the wall clock)")
    ] = False,
) -> None:
    """Read agents' pushes and Prometheus, detect, open / resolve incidents, diagnose, propose actions, alert."""
    from vigil.config import load_settings
    from vigil.model import Topology
    from vigil.remedy.acting import acting_line, chosen_actuator, remediator_for
    from vigil.remedy.lifecycle import LifecycleStore
    from vigil.run.engine import Engine
    from vigil.sources.promql import PromQLSource
    from vigil.store.sql import open_store

    settings = load_settings(config)
    actuator = chosen_actuator(actuator, settings)
    if is_demo_store(settings) and not on_demo_store:
        raise VigilInputError(f"{settings.database_url()} is a `vigil demo` run: the engine would open its incidents "
                              "again and resolve them by the wall clock (--on-demo-store runs it anyway)")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prom = PromQLSource(settings.metrics_url) if settings.metrics_url else None
    store = open_store(settings)
    remediator = remediator_for(actuator, settings, store.topology() or Topology(),
                                LifecycleStore(settings.database_url()), "vigil-engine")
    live = Engine(store, settings, prom=prom, remediator=remediator)
    if remediator is not None:
        typer.echo(acting_line(actuator, settings.execute_actions), err=True)
    lease_s = remediator.lease_s if remediator is not None else settings.remedy_lease_s

    def work() -> None:
        if not live.start(wait=not once):
            if not live.stop.is_set():  # --once beside the engine that judges the store: nothing to do
                typer.echo(f"another engine ({live.standing_by}) judges this store; nothing done", err=True)
            return
        if live.resumed_actions:
            typer.echo(f"resumed {live.resumed_actions} interrupted action(s)", err=True)
        if live.stop.is_set():  # Ctrl-C or SIGTERM while resuming at start: the action in flight ended, nothing more
            return
        if once:
            report = live.tick()
            live.finish_resuming()
            live.release()
            typer.echo(f"events {report.events}, pushes {report.pushes}, anomalies {report.anomalies}, "
                       f"opened {len(report.opened)}, changed {len(report.changed)}, resolved {len(report.resolved)}, "
                       f"actions {report.actions}")
            return
        typer.echo(f"vigil engine on {settings.database_url()} every {settings.engine_interval_s:g} s", err=True)
        live.run()

    with closed_at_exit(store, live):
        run_stoppable(work, live.stop, who="vigil engine", bound_s=lease_s,
                      waiting=f"waiting for the tick and the actions it is resuming, at most {lease_s:g} s",
                      left="without finishing the current round; an action it was resuming is taken over by another "
                      "server or engine once this process's lease on it lapses")
