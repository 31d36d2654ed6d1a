"""`vigil engine`: the live loop as its own process (for scale; `vigil serve` runs one by default)."""

from __future__ import annotations

import contextlib
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer


def engine(
    config: Annotated[Path | None, typer.Option("--config", help="settings YAML file (else VIGIL_* env)")] = None,
    once: Annotated[bool, typer.Option("--once", help="one tick, print what it did, exit")] = False,
) -> None:
    """Read agents' pushes and Prometheus, detect, open / resolve incidents, diagnose, propose actions, alert."""
    from vigil.config import load_settings
    from vigil.run.engine import Engine
    from vigil.sources.promql import PromQLSource
    from vigil.store.sql import open_store

    settings = load_settings(config)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prom = PromQLSource(settings.metrics_url) if settings.metrics_url else None
    live = Engine(open_store(settings), settings, prom=prom)
    if once:
        report = live.tick()
        typer.echo(f"events {report.events}, pushes {report.pushes}, anomalies {report.anomalies}, "
                   f"opened {len(report.opened)}, changed {len(report.changed)}, resolved {len(report.resolved)}, "
                   f"actions {report.actions}")
        return
    signal.signal(signal.SIGTERM, lambda *_: live.stop.set())
    typer.echo(f"vigil engine on {settings.database_url()} every {settings.engine_interval_s:g} s", err=True)
    with contextlib.suppress(KeyboardInterrupt):
        live.run()
