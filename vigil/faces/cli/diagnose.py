"""`vigil diagnose`: explain a run directory left by `vigil launch`, or a directory of FR dumps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from vigil.model import VigilInputError


def diagnose_command(
    path: Annotated[
        Path | None,
        typer.Argument(help="run directory of `vigil launch` / the probe, or a directory of Flight Recorder dumps"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the diagnosis as JSON")] = False,
    incident: Annotated[str | None, typer.Option(
        "--incident", help="diagnose a stored incident: ranked root causes, evidence timeline, plan")] = None,
    html: Annotated[bool, typer.Option("--html", help="with --incident: the report as HTML")] = False,
) -> None:
    """Say whether a job hung, crashed, mismatched or straggled, which rank or link is the culprit, and why."""
    if incident is not None:
        from vigil.faces.cli.rca import diagnose_incident

        diagnose_incident(incident, as_json=as_json, html=html)
        return
    if path is None:
        raise VigilInputError("vigil diagnose needs a PATH: a run directory or a directory of FR dumps")
    from vigil.diagnose.hang_render import print_diagnosis
    from vigil.diagnose.hang_source import diagnose_path

    diagnosis = diagnose_path(path)
    if as_json:
        typer.echo(diagnosis.model_dump_json(indent=2))
    else:
        print_diagnosis(diagnosis, Console())
