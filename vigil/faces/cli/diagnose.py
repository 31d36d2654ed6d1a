"""`vigil diagnose run DIR` (a job's hang, crash, mismatch or straggler) and `vigil diagnose incident ID`
(the root cause of a stored incident): two verbs, each with only the options that apply to it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from vigil.faces.cli.output import SafeConsole
from vigil.model import VigilInputError

app = typer.Typer(help="Explain a failed job (run) or a stored incident (incident).", no_args_is_help=True)
LATEST = "latest"


def run_path(path: Path) -> Path:
    """A directory of runs (``vigil-runs``) stands for its newest run, the one ``latest`` points at."""
    latest = path / LATEST
    if path.is_dir() and latest.is_dir() and not (path / "diagnosis.json").exists() and not any(path.glob("rank*")):
        return latest.resolve()
    return path


@app.command("run")
def run_command(
    path: Annotated[
        Path,
        typer.Argument(help="run directory of `vigil launch` / the probe (or a directory of runs: its latest), a "
                       "directory of Flight Recorder dumps, or a JSON file of NCCL proxy states"),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print the diagnosis as JSON")] = False,
) -> None:
    """Say whether a job hung, crashed, mismatched or straggled, which rank or link is the culprit, and why.

    Exit status (the same as vigil launch script): 0 ok or slow, 3 crash, 4 hang, 5 mismatch, 2 bad input.
    """
    from vigil.diagnose.hang_render import print_diagnosis
    from vigil.diagnose.hang_source import diagnose_path

    diagnosis = diagnose_path(run_path(path))
    if as_json:
        typer.echo(diagnosis.model_dump_json(indent=2))
    else:
        print_diagnosis(diagnosis, SafeConsole())
    raise typer.Exit(diagnosis.exit_code)


@app.command("incident")
def incident_command(
    incident_id: Annotated[str, typer.Argument(help="incident id, as `vigil incidents` lists them")],
    as_json: Annotated[bool, typer.Option("--json", help="the report as JSON")] = False,
    html: Annotated[bool, typer.Option("--html", help="the report as HTML")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="write the report to this file")] = None,
) -> None:
    """Rank the root causes of a stored incident; print its evidence timeline, causes and remediation plan."""
    from vigil.faces.cli.rca import diagnose_incident

    if as_json and html:
        raise VigilInputError("--json and --html choose the report's format: give one of them")
    diagnose_incident(incident_id, as_json=as_json, html=html, out=out)
